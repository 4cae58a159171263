"""Several models behind one port (`edgellm serve --models`): the router of child servers
(router.py), its routes (routes.py) and its launcher (run.py)."""
