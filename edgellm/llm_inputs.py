"""LLM's requests that are not generation: scoring (teacher-forced logits) and embeddings, each sent to the
engine core as a request of its kind (engine/protocol.py RequestKind), which the scheduler plans like a
prompt. A mixin of LLM (llm.py), checked here in the front-end like a prompt is."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgellm.engine.checks import (
    PromptTooLongError,
    check_embedding_input,
    check_pooling,
    check_score_input,
    encode_within,
)
from edgellm.engine.protocol import EngineCoreRequest, RequestKind

if TYPE_CHECKING:
    import itertools

    from edgellm.engine.core_client import CoreClient
    from edgellm.gguf.config import ModelConfig
    from edgellm.tokenizer import Tokenizer


class InputRequestsMixin:
    core: CoreClient
    config: ModelConfig
    tokenizer: Tokenizer
    n_ctx: int
    metadata: dict[str, Any]
    _rids: itertools.count

    def _new_group(self) -> str:
        """A group id for the requests of one call (the engine shares each step's tokens out per group)."""
        return f"call-{next(self._rids)}"

    def score(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits: float32 [len(ids), n_vocab], row t predicting token t+1. A scoring
        request through the engine: chunked like a prompt, batched with whatever else runs."""
        import queue

        ids = list(ids)
        check_score_input(ids, self.n_ctx, self.config.n_vocab)
        q: queue.Queue = queue.Queue()
        rid = f"score-{next(self._rids)}"
        self.core.add(EngineCoreRequest(rid, ids, None, kind=RequestKind.SCORE), q.put)
        try:
            item = q.get()
        except BaseException:
            self.core.abort(rid)
            raise
        if isinstance(item, BaseException):
            raise item
        return item[-1][0].logits

    # ---- embeddings ----------------------------------------------------------------------------
    def embedding_ids(self, text: str | Sequence[int]) -> list[int]:
        """An input to embed as checked token ids (text gets BOS when the model's metadata says so); unlike
        a prompt it may fill the whole context window. Longer inputs raise PromptTooLongError."""
        if isinstance(text, str):
            try:
                ids = encode_within(self.tokenizer, text, self.n_ctx, self.n_ctx)
            except PromptTooLongError as e:
                raise PromptTooLongError(
                    e.num_tokens, self.n_ctx, f"input has {e.count} tokens but the context window "
                    f"is {self.n_ctx} tokens", at_least=True
                ) from None
        else:
            ids = list(text)
        check_embedding_input(ids, self.n_ctx, self.tokenizer.vocab_size)
        return ids

    def submit_embedding(
        self, ids: list[int], deliver: Callable[[Any], None], priority: int = 0, group: str | None = None
    ) -> str:
        """Start one embedding request through the engine (batched with whatever else runs); `deliver`
        gets its [n_embd] float32 vector, or an exception, on the core client's thread. `group`: as
        submit's (embed and aembed give all the inputs of one call one group)."""
        rid = f"emb-{next(self._rids)}"
        req = EngineCoreRequest(rid, ids, None, priority, group, RequestKind.EMBED)
        self.core.add(req, lambda item: deliver(_embedding(item)))
        return rid

    def embed(self, inputs: str | Sequence[int] | Sequence[str | Sequence[int]]) -> np.ndarray:
        """Embeddings: float32 [len(inputs), n_embd], each row the input's final hidden states (after the
        output norm) pooled as the model's GGUF says (mean unless its pooling_type says cls or last) and
        L2-normalized. An input is text or token ids; a single one gives one row."""
        check_embedding_model(self.config)
        ids = [self.embedding_ids(x) for x in as_list(inputs)]
        return self._pooled(ids, self.config.n_embd)

    def rerank(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """A reranker's relevance score of each document for the query, in the documents' order: float32
        [len(documents)], the classification head's first output for the prompt llama-server builds
        (rerank_ids), as llama-server's /v1/rerank scores it (unnormalised)."""
        check_reranker(self.config)
        ids = [self.rerank_ids(query, d) for d in documents]
        return self._pooled(ids, self.config.n_cls_out)[:, 0] if ids else np.empty(0, np.float32)

    def rerank_ids(self, query: str, document: str) -> list[int]:
        """The query/document pair as llama-server's format_prompt_rerank builds it: the GGUF's
        tokenizer.chat_template.rerank with {query} and {document} put in (special tokens parsed), else
        BOS query (EOS) (SEP) document (EOS), each part tokenized without specials. Checked as an input
        to embed."""
        tok = self.tokenizer
        template = self.metadata.get("tokenizer.chat_template.rerank")
        if isinstance(template, str):
            text = template.replace("{query}", query).replace("{document}", document)
            return self.embedding_ids(tok.encode(text, add_special=False, parse_special=True))
        q = tok.encode(query, add_special=False, parse_special=False)
        d = tok.encode(document, add_special=False, parse_special=False)
        eos = tok.eos_id if tok.eos_id is not None else tok.sep_id
        ids = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
        ids += q
        if tok.add_eos and eos is not None:
            ids.append(eos)
        if tok.add_sep and tok.sep_id is not None:
            ids.append(tok.sep_id)
        ids += d
        if tok.add_eos and eos is not None:
            ids.append(eos)
        return self.embedding_ids(ids)

    def _pooled(self, ids: list[list[int]], width: int) -> np.ndarray:
        """The engine's pooled vectors [len(ids), width] for checked inputs, as one group."""
        import queue

        out = np.empty((len(ids), width), np.float32)
        q: queue.Queue = queue.Queue()
        rids, group = [], self._new_group()
        try:
            for i, x in enumerate(ids):
                rids.append(self.submit_embedding(x, lambda v, i=i: q.put((i, v)), group=group))
            for _ in ids:
                i, v = q.get()
                if isinstance(v, BaseException):
                    raise v
                out[i] = v
        except BaseException:
            self.core.abort_all(rids)  # a no-op for those that finished
            raise
        return out

    async def aembed(self, ids: list[list[int]]) -> np.ndarray:
        """`embed` of checked token ids (embedding_ids) for an asyncio app; cancelling it aborts them."""
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in ids]

        def settle(fut: asyncio.Future, v: Any) -> None:
            if not fut.done():  # (cancelled: nobody waits any more)
                fut.set_exception(v) if isinstance(v, BaseException) else fut.set_result(v)

        rids, done, group = [], False, self._new_group()
        try:
            for x, f in zip(ids, futs, strict=True):
                deliver = functools.partial(loop.call_soon_threadsafe, settle, f)
                rids.append(self.submit_embedding(x, deliver, group=group))
            vecs = await asyncio.gather(*futs)
            done = True
        finally:
            if not done:
                self.core.abort_all(rids)
        return np.stack(vecs) if vecs else np.empty((0, self.config.n_embd), np.float32)


def check_embedding_model(cfg: ModelConfig) -> None:
    """ValueError unless the model gives one vector per input: not a reranker, not pooling none."""
    if cfg.pooling == "rank":
        raise ValueError(
            f"this model ({cfg.arch}) is a reranker (pooling_type rank): it scores query/document pairs "
            "(rerank, /v1/rerank), it gives no embeddings"
        )
    check_pooling(cfg.pooling)


def check_reranker(cfg: ModelConfig) -> None:
    """ValueError unless the model is a reranker (pooling_type rank, a classification head)."""
    if cfg.pooling == "rank":
        check_pooling(cfg.pooling, head=cfg.rank_head)  # a decoder without a head: not implemented
    else:
        raise ValueError(
            f"this model ({cfg.arch}, pooling {cfg.pooling!r}) is not a reranker: reranking needs a model "
            "whose GGUF pooling_type is rank (a cross-encoder with a classification head)"
        )


def _embedding(item: Any) -> Any:
    """A core client sink item for an embedding request -> its vector, or the exception as it came."""
    return item if isinstance(item, BaseException) else item[-1][0].embedding


def as_list(prompts: Any) -> list:
    if isinstance(prompts, str | dict) or (prompts and isinstance(prompts[0], int)):  # dict: with images
        return [prompts]
    return list(prompts)
