"""``--chatml`` and ``--no-think``: prompts rendered with the model's chat template, and the
conversation a ``--session`` keeps, as the native engine keeps it.

With ``--chatml`` a prompt becomes a user message and the whole conversation so far is rendered
with the model's own template (``tokenizer.chat_template``, a Jinja template; ChatML when the
model has none), with the generation prompt appended and ``enable_thinking`` set from the
request (``--no-think`` or ``"think": false``); the text is tokenized with the special tokens
parsed. The answer is the generated text with any ``<think>...</think>`` span taken out as the
reasoning (also when the rendered prompt opened it).

A session's turns keep or drop the context as the native engine does (:class:`Conversation`):

- ``clear_kv`` (the default) starts over: the KV cache and the conversation are dropped;
- with a chat template a continued turn re-renders the whole conversation, keeps the KV prefix
  it shares with what is decoded, and prefills the rest: ``n_prompt`` counts the tokens
  prefilled, ``n_past`` the tokens in the KV after the turn;
- without one a continued turn's prompt is tokenized on its own (with its BOS) and decoded
  after what the KV holds: ``n_prompt`` is the whole prompt and ``n_past`` is ``n_prompt``
  plus the tokens generated (the turn's own length, not the context's);
- a cancelled turn is undone: with a template back to the turn's shared prefix and without the
  user message, without one the KV is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: The ChatML template (what llama.cpp renders for a model without a template of its own).
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
THINK_OPEN, THINK_CLOSE = b"<think>", b"</think>"


class ChatTemplate:
    """A chat template, compiled once (Jinja, sandboxed, blocks trimmed as llama.cpp does)."""

    def __init__(self, source: str | None, bos: str = "", eos: str = ""):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.source = source or CHATML_TEMPLATE
        self.is_model_own = bool(source)
        env = ImmutableSandboxedEnvironment(
            loader=jinja2.BaseLoader(),
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=["jinja2.ext.loopcontrols"],
        )

        def fail(message: str) -> None:
            raise jinja2.TemplateError(message)

        env.globals["raise_exception"] = fail
        self._template = env.from_string(self.source)
        self.bos, self.eos = bos, eos

    def render(
        self, messages: Sequence[dict[str, Any]], *, think: bool = True, generation: bool = True
    ) -> str:
        """The conversation `messages` as the model's prompt text."""
        return self._template.render(
            messages=list(messages),
            add_generation_prompt=generation,
            enable_thinking=think,
            bos_token=self.bos,
            eos_token=self.eos,
        )

    @property
    def think_control(self) -> str:
        """``BMOE_READY``'s ``think_ctl``: ``template`` when passing the flag is all there is
        to do (the template reads it, or it has no reasoning span), ``none`` when the template
        writes a ``<think>`` span it does not let ``enable_thinking`` turn off."""
        probe = [{"role": "user", "content": "x"}]
        if self.render(probe, think=True) != self.render(probe, think=False):
            return "template"
        return "none" if THINK_OPEN.decode() in self.source else "template"


def model_template(model: Any) -> ChatTemplate:
    """The chat template of a loaded model (:class:`~bmoe.engine.embedded.model.LlamaModel`),
    ChatML when it has none."""
    bos, eos = model.token_text(model.bos), model.token_text(model.eos)
    return ChatTemplate(model.chat_template(), bos, eos)


def opens_reasoning(prompt: str) -> bool:
    """The rendered prompt leaves a ``<think>`` span open (the model starts inside it)."""
    return prompt.rfind(THINK_OPEN.decode()) > prompt.rfind(THINK_CLOSE.decode())


def split_reasoning(text: bytes, opened: bool = False) -> tuple[bytes, bytes]:
    """(reasoning, answer) of generated `text`: a leading ``<think>...</think>`` span (or, when
    the prompt `opened` one, everything up to ``</think>``) is the reasoning; an unclosed span
    is all reasoning so far."""
    rest = text
    if not opened:
        stripped = rest.lstrip()
        if not stripped.startswith(THINK_OPEN):
            return b"", text
        rest = stripped[len(THINK_OPEN) :]
    reasoning, closed, answer = rest.partition(THINK_CLOSE)
    if not closed:
        return reasoning.strip(), b""
    return reasoning.strip(), answer.lstrip()


@dataclass
class TextSplit:
    """Streams a generation's (reasoning, answer) as the deltas ``BMOE_PROGRESS`` carries;
    a split that moves text from one side to the other (a closing tag arrived) is a reset."""

    opened: bool = False
    reasoning: bytes = b""
    answer: bytes = b""

    def update(self, text: bytes) -> tuple[bytes, bytes, bool]:
        """(delta_reasoning, delta_text, reset) after the generation grew to `text`."""
        reasoning, answer = split_reasoning(text, self.opened)
        grew = reasoning.startswith(self.reasoning) and answer.startswith(self.answer)
        if grew:
            out = reasoning[len(self.reasoning) :], answer[len(self.answer) :], False
        else:
            out = reasoning, answer, True
        self.reasoning, self.answer = reasoning, answer
        return out


@dataclass
class TurnPlan:
    """How one generate request is decoded: `tokens` prefilled from KV position `start`."""

    tokens: list[int]
    start: int
    n_prompt: int  # what BMOE_DONE reports as prefilled
    n_tokens: int  # the whole prompt's tokens (the native n_ctx check counts these)
    opened: bool = False  # the rendered prompt leaves a reasoning span open


@dataclass
class Conversation:
    """What a session keeps between turns (see the module docstring for the rules)."""

    template: ChatTemplate | None
    history: list[dict[str, Any]] = field(default_factory=list)
    kv_tokens: list[int] = field(default_factory=list)  # what the KV holds (chat only)
    kv_length: int = 0  # positions the KV holds
    _pushed: bool = False
    _common: int = 0

    def plan(self, model: Any, prompt: str, *, clear: bool, think: bool) -> TurnPlan:
        """The tokens of this turn and where they go; `model` tokenizes (and forgets the KV
        past the shared prefix). Call :meth:`commit` or :meth:`undo` after the turn."""
        if clear:
            model.clear_memory()
            self.history, self.kv_tokens, self.kv_length = [], [], 0
        if self.template is None:
            tokens = model.tokenize(prompt.encode("utf-8", "surrogateescape"), add_special=True)
            self._pushed, self._common = False, 0
            return TurnPlan(tokens, self.kv_length, len(tokens), len(tokens))
        self.history.append({"role": "user", "content": prompt})
        self._pushed = True
        text = self.template.render(self.history, think=think)
        tokens = model.tokenize(text.encode("utf-8", "surrogateescape"), True, parse_special=True)
        common = 0
        limit = min(len(self.kv_tokens), len(tokens) - 1)
        while common < limit and self.kv_tokens[common] == tokens[common]:
            common += 1
        if common < len(self.kv_tokens) and not model.forget_from(common):
            model.clear_memory()  # a memory that cannot drop a tail (sliding window)
            common = 0
        self.kv_tokens = self.kv_tokens[:common]
        self.kv_length = common
        self._common = common
        opened = opens_reasoning(text)
        return TurnPlan(tokens[common:], common, len(tokens) - common, len(tokens), opened)

    def refuse(self) -> None:
        """The planned turn was refused before it ran: the conversation is as it was."""
        if self._pushed:
            self.history.pop()
            self._pushed = False

    def commit(self, plan: TurnPlan, generated: list[int], answer: str) -> int:
        """The turn ran to its end: the KV holds its prompt and tokens; returns ``n_past``."""
        self.kv_length += len(plan.tokens) + len(generated)
        if self.template is None:
            return plan.n_prompt + len(generated)
        self.kv_tokens += plan.tokens + generated
        self.history.append({"role": "assistant", "content": answer})
        self._pushed = False
        return len(self.kv_tokens)

    def undo(self, model: Any) -> None:
        """The turn was cancelled: back to where it started."""
        if self.template is None:
            model.clear_memory()
            self.kv_length = 0
            return
        if not model.forget_from(self._common):
            model.clear_memory()
            self.kv_tokens, self._common = [], 0
        self.kv_tokens = self.kv_tokens[: self._common]
        self.kv_length = len(self.kv_tokens)
        self.refuse()


__all__ = [
    "CHATML_TEMPLATE",
    "ChatTemplate",
    "Conversation",
    "TextSplit",
    "TurnPlan",
    "model_template",
    "opens_reasoning",
    "split_reasoning",
]
