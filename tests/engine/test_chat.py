"""``--chatml``, ``--no-think`` and how session turns keep or drop the context.

The expected token counts are derived apart from the engine: the ChatML text is written out
here by hand and tokenized by llama-cpp-python's own vocabulary-only model, and the reuse rule
(the longest prefix shared with what the KV holds, at most all but one token) is applied to
those tokens here.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from bmoe.engine.embedded.chat import (
    ChatTemplate,
    TextSplit,
    opens_reasoning,
    split_reasoning,
)
from bmoe.engine.synth import CHAT_TEMPLATES

PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."
SECOND = "And which one is hot?"


def _chatml(messages: list[tuple[str, str]], think_off: bool = False) -> str:
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    return text + "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if think_off else "")


def test_templates_render_the_conversation_as_chatml() -> None:
    fallback = ChatTemplate(None)  # a model without a template of its own
    messages = [("user", "hi"), ("assistant", "yo"), ("user", "more")]
    as_dicts = [{"role": r, "content": c} for r, c in messages]
    assert fallback.render(as_dicts) == _chatml(messages)
    assert fallback.render(as_dicts, generation=False) == _chatml(messages).removesuffix(
        "<|im_start|>assistant\n"
    )
    think = ChatTemplate(CHAT_TEMPLATES["think"])
    assert think.render(as_dicts, think=False) == _chatml(messages, think_off=True)
    assert think.render(as_dicts, think=True) == _chatml(messages)
    assert (fallback.think_control, think.think_control) == ("template", "template")
    ignores = ChatTemplate("{{ messages[0].content }}<think>")  # reasons, cannot be told not to
    assert ignores.think_control == "none"


def test_reasoning_is_split_from_the_answer() -> None:
    assert split_reasoning(b"plain answer") == (b"", b"plain answer")
    assert split_reasoning(b"<think>\nhmm\n</think>\n\nyes") == (b"hmm", b"yes")
    assert split_reasoning(b"<think>still going") == (b"still going", b"")
    assert split_reasoning(b"hmm</think>yes", opened=True) == (b"hmm", b"yes")
    assert opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_streamed_deltas_reset_when_a_closing_tag_moves_text() -> None:
    opened = TextSplit(opened=True)  # the prompt opened the span: all reasoning until closed
    assert opened.update(b"abc") == (b"abc", b"", False)
    assert opened.update(b"abc de") == (b" de", b"", False)
    assert opened.update(b"abc de</think>ok") == (b"", b"ok", False)
    split = TextSplit()
    assert split.update(b"<thi") == (b"", b"<thi", False)  # not a span yet: answer
    assert split.update(b"<think>ok") == (b"ok", b"", True)  # it was: both replaced
    assert split.update(b"<think>ok</think>yes") == (b"", b"yes", False)


# ----------------------------------------------------------------------------- the engine

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from bmoe.engine.embedded.config import EngineConfig  # noqa: E402
from bmoe.engine.embedded.run import run_engine  # noqa: E402
from bmoe.engine.embedded.serve import serve_session  # noqa: E402
from bmoe.engine.synth import synth_model  # noqa: E402
from bmoe.formats import protocol  # noqa: E402
from bmoe.formats.metrics import read_metrics  # noqa: E402
from bmoe.formats.route import read_route_trace  # noqa: E402

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def think_model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("think")
    return synth_model(folder / "m.gguf", "tiny", chat_template="think")


@pytest.fixture(scope="module")
def vocab(tiny_model):
    """llama-cpp-python's own tokenizer of the synthetic vocabulary (no weights loaded)."""
    model = llama_cpp.Llama(str(tiny_model), vocab_only=True, verbose=False)

    def tokenize(text: str) -> list[int]:
        return model.tokenize(text.encode(), add_bos=True, special=True)

    return tokenize


def _session(model: Path, requests: list[str], **kw) -> list[protocol.Event]:
    cfg = EngineConfig(model=str(model), n_predict=6, threads=1, moe_stream=True, cache_mb=2, **kw)
    out = io.BytesIO()
    serve_session(cfg, stdin=io.BytesIO(("\n".join(requests) + "\n").encode()), out=out)
    return list(protocol.iter_events(out.getvalue().splitlines()))


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b) - 1) and a[n] == b[n]:
        n += 1
    return n


def test_a_chat_turn_continues_from_the_prefix_it_shares(tiny_model, vocab, tmp_path) -> None:
    route = tmp_path / "s.route.csv"
    events = _session(
        tiny_model,
        [
            protocol.encode_request("generate", id=1, prompt=PROMPT),
            protocol.encode_request("generate", id=2, prompt=SECOND, clear_kv=False),
            protocol.encode_request("generate", id=3, prompt=SECOND),  # a new chat
        ],
        chatml=True,
        route_trace=str(route),
    )
    done = [e.data for e in events if e.tag == "DONE"]
    first_prompt = vocab(_chatml([("user", PROMPT)]))
    assert (done[0]["n_prompt"], done[0]["n_past"]) == (len(first_prompt), len(first_prompt) + 6)
    # the second turn re-renders the conversation with the first answer in it
    answer = done[0]["text"]
    rendered = vocab(_chatml([("user", PROMPT), ("assistant", answer), ("user", SECOND)]))
    trace = read_route_trace(route).rows
    first_gen = trace[(trace["turn"] == 0) & (trace["phase"] == 1)]
    assert len(first_gen["step"].unique()) == 6
    one_shot = EngineConfig(model=str(tiny_model), prompt=PROMPT, n_predict=6, chatml=True)
    kv_after_first = first_prompt + run_engine(one_shot).tokens
    shared = _common(kv_after_first, rendered)
    assert done[1]["n_prompt"] == len(rendered) - shared
    assert done[1]["n_past"] == len(rendered) + 6
    # its prefill starts where the shared prefix ends
    second = trace[(trace["turn"] == 1) & (trace["phase"] == 0)]
    assert second["step"].min() == shared
    # clear_kv (the default) starts over: the same counts as a first turn of that prompt
    alone = vocab(_chatml([("user", SECOND)]))
    assert (done[2]["n_prompt"], done[2]["n_past"]) == (len(alone), len(alone) + 6)


def test_without_a_template_a_continued_turn_counts_as_native_does(tiny_model, vocab) -> None:
    events = _session(
        tiny_model,
        [
            protocol.encode_request("generate", id=1, prompt=PROMPT),
            protocol.encode_request("generate", id=2, prompt=SECOND, clear_kv=False),
        ],
    )
    done = [e.data for e in events if e.tag == "DONE"]
    whole = len(vocab(SECOND))  # its own BOS included
    assert (done[1]["n_prompt"], done[1]["n_past"]) == (whole, whole + 6)


def test_no_think_renders_the_closed_span_and_a_cancelled_turn_is_undone(think_model) -> None:
    llm = llama_cpp.Llama(str(think_model), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(llm.tokenize(text.encode(), add_bos=True, special=True))

    events = _session(
        think_model,
        [
            protocol.encode_request("generate", id=1, prompt=PROMPT, think=False),
            protocol.encode_request("generate", id=2, prompt=PROMPT),
        ],
        chatml=True,
    )
    ready = next(e.data for e in events if e.tag == "READY")
    assert ready["think_ctl"] == "template"
    done = [e.data for e in events if e.tag == "DONE"]
    assert done[0]["n_prompt"] == count(_chatml([("user", PROMPT)], think_off=True))
    assert done[1]["n_prompt"] == count(_chatml([("user", PROMPT)]))
    # --no-think is the session's default for "think"
    flagged = _session(
        think_model, [protocol.encode_request("generate", id=1, prompt=PROMPT)], chatml=True,
        think=False,
    )  # fmt: skip
    assert next(e.data for e in flagged if e.tag == "DONE")["n_prompt"] == done[0]["n_prompt"]


def test_one_shot_chatml_renders_the_prompt_and_says_so(think_model, tmp_path) -> None:
    csv = tmp_path / "run.csv"
    cfg = EngineConfig(
        model=str(think_model), prompt=PROMPT, n_predict=4, threads=1, chatml=True,
        think=False, csv=str(csv),
    )  # fmt: skip
    result = run_engine(cfg)
    llm = llama_cpp.Llama(str(think_model), vocab_only=True, verbose=False)
    expected = llm.tokenize(
        _chatml([("user", PROMPT)], think_off=True).encode(), add_bos=True, special=True
    )
    assert result.n_prompt == len(expected)
    assert read_metrics(csv).params["chatml"] in (1, True)


def test_the_context_margin_is_the_native_engines(tiny_model, vocab) -> None:
    n_prompt = len(vocab(PROMPT))
    room = 256 - n_prompt - 8  # the native engine keeps 8 positions free
    events = _session(
        tiny_model,
        [
            protocol.encode_request("generate", id=1, prompt=PROMPT, n_predict=room + 1),
            protocol.encode_request("generate", id=2, prompt=PROMPT, n_predict=room),
        ],
        ctx_size=256,
    )
    errors = [e.data for e in events if e.tag == "ERROR"]
    assert [e["id"] for e in errors] == [1] and "exceeds the session n_ctx" in errors[0]["msg"]
    assert [e.data["id"] for e in events if e.tag == "DONE"] == [2]
