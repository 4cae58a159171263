"""Modal screens: settings (sampling, system prompt, model picker), rename, and a yes/no question."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from tui.messages import GenerationSettings


@dataclass
class SettingsResult:
    settings: GenerationSettings
    model: str


class SettingsScreen(ModalScreen[SettingsResult | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, settings: GenerationSettings, model: str, models: list[tuple[str, str]]) -> None:
        super().__init__()
        self.settings = settings
        self.model = model
        self.models = models if any(v == model for _, v in models) or not model else [*models, (model, model)]

    def compose(self) -> ComposeResult:
        s = self.settings
        with Vertical(id="settings-dialog", classes="dialog"):
            yield Label("Settings", classes="dialog-title")
            yield Label("Model")
            value = self.model or Select.BLANK
            yield Select(self.models, value=value, allow_blank=not self.model, id="model")
            yield Label("System prompt")
            yield TextArea(s.system_prompt, id="system-prompt", soft_wrap=True, tab_behavior="focus")
            with Grid(id="sampling-grid"):
                yield Label("Temperature")
                yield Input(str(s.temperature), id="temperature", type="number")
                yield Label("Top-p")
                yield Input(str(s.top_p), id="top-p", type="number")
                yield Label("Max tokens")
                yield Input(str(s.max_tokens), id="max-tokens", type="integer")
                yield Label("Seed (empty: random)")
                yield Input("" if s.seed is None else str(s.seed), id="seed", type="integer")
            yield Static("", id="settings-error", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def _read(self) -> SettingsResult:
        """The form's values, or ValueError with a sentence saying which field is wrong."""

        def number(field: str, label: str, lo: float, hi: float, integer: bool = False) -> float:
            raw = self.query_one(f"#{field}", Input).value.strip()
            try:
                value = int(raw) if integer else float(raw)
            except ValueError:
                raise ValueError(f"{label} must be a number") from None
            if not lo <= value <= hi:
                raise ValueError(f"{label} must be between {lo:g} and {hi:g}")
            return value

        temperature = number("temperature", "Temperature", 0.0, 5.0)
        top_p = number("top-p", "Top-p", 0.0, 1.0)
        if top_p <= 0:
            raise ValueError("Top-p must be greater than 0")
        max_tokens = int(number("max-tokens", "Max tokens", 1, 1_000_000, integer=True))
        seed_raw = self.query_one("#seed", Input).value.strip()
        seed = int(number("seed", "Seed", 0, 2**63 - 1, integer=True)) if seed_raw else None
        model = self.query_one("#model", Select).value
        system = self.query_one("#system-prompt", TextArea).text
        settings = GenerationSettings(system, temperature, top_p, max_tokens, seed)
        return SettingsResult(settings, model if isinstance(model, str) else self.model)

    def action_save(self) -> None:
        try:
            result = self._read()
        except ValueError as e:
            error = self.query_one("#settings-error", Static)
            error.update(str(e))
            error.add_class("shown")
            return
        self.dismiss(result)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_cancel()


class RenameScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str) -> None:
        super().__init__()
        self.current = title

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog small"):
            yield Label("Rename conversation", classes="dialog-title")
            yield Input(self.current, id="title")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """A question with two answers (delete a conversation, drop the oldest turns)."""

    BINDINGS = [Binding("escape", "no", "Cancel")]

    def __init__(self, question: str, yes: str = "Yes", no: str = "Cancel") -> None:
        super().__init__()
        self.question, self.yes, self.no = question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog small"):
            yield Static(self.question, classes="question", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button(self.yes, variant="warning", id="yes")
                yield Button(self.no, id="no")

    def on_mount(self) -> None:
        self.query_one("#yes", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_no(self) -> None:
        self.dismiss(False)
