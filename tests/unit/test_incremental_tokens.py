"""Appends re-tokenize only a text stream's tail: the ids must equal the whole text's, always.

Real tokenizers: the embedded model's (SmolLM2, byte-level BPE), the tests' tiny Llama with a
BOS, and a Metaspace (SentencePiece-style) tokenizer, which splits differently in pieces: for it
the finish's check must catch the difference and the final prompt is still exact. The manager
runs over FakeTM (tests/unit/test_chat_stream.py): no engine, its turns are recorded.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s2l_sglang.stream.tokens import RETOKENIZE_TAIL, Anchor, tokenize_from
from tests.unit.test_chat_stream import FakeTM


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoTokenizer

    from s2l_sglang import model

    return AutoTokenizer.from_pretrained(model.prepare())


@pytest.fixture(scope="module")
def bos_llama(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.helpers import build_tiny_llama

    return AutoTokenizer.from_pretrained(
        build_tiny_llama(tmp_path_factory.mktemp("bos"), add_bos=True)
    )


@pytest.fixture(scope="module")
def metaspace():
    """A SentencePiece-style tokenizer: a word-start marker is put before the first word of
    every text it encodes, so a tail tokenized alone gains a marker the whole text lacks."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    bpe.decoder = decoders.Metaspace(prepend_scheme="always")
    words = "the cat sat on a mat and then it ran far away from home ever after".split()
    bpe.train_from_iterator([" ".join(words[i:] + words[:i]) for i in range(len(words))],
                            trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>"]))  # fmt: skip
    return PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>")


def text_sample() -> str:
    from bench.harness.presets import REPO_ROOT, WORKLOAD_FILES
    from bench.traces import read_traces

    traces = read_traces(REPO_ROOT / WORKLOAD_FILES["crawler"])
    return "".join(t.final_context for t in traces[:2])[:6000] + " naïve café 日本語 🙂🙂 end"


TEXT = text_sample()


def grow(tokenizer, text: str, cuts: list[int], special: bool = True) -> list[list[int]]:
    """The incremental ids after each cut of `text` (cuts ascending)."""
    anchor, ids, out = Anchor(), [], []
    for cut in cuts:
        head = ids[: anchor.tokens]
        ids, anchor = tokenize_from(tokenizer, text[:cut], anchor, head, special)
        out.append(ids)
    return out


cuts_strategy = st.lists(st.integers(1, len(TEXT)), min_size=1, max_size=40, unique=True).map(
    sorted
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cuts=cuts_strategy)
def test_byte_level_bpe_in_pieces_equals_whole_text(smollm2, bos_llama, cuts):
    for tok in (smollm2, bos_llama):
        for cut, ids in zip(cuts, grow(tok, TEXT, cuts), strict=True):
            assert ids == tok(TEXT[:cut])["input_ids"], (tok.name_or_path, cut)


def test_the_anchor_moves_and_the_bos_stays(bos_llama):
    cuts = list(range(100, 3000, 100))
    anchor, ids = Anchor(), []
    for cut in cuts:
        ids, anchor = tokenize_from(bos_llama, TEXT[:cut], anchor, ids[: anchor.tokens], True)
    assert ids[0] == bos_llama.bos_token_id and ids.count(bos_llama.bos_token_id) == 1
    # all but the last RETOKENIZE_TAIL tokens (about) are behind the anchor: an append re-reads
    # a few dozen characters, not the whole text
    assert anchor.tokens >= len(ids) - 2 * RETOKENIZE_TAIL and anchor.chars > 2500


def test_metaspace_differs_in_pieces(metaspace):
    text = "thecatsaton amatandthenitran farawayfromhome " * 8  # words split into pieces
    cuts = list(range(20, len(text), 20))
    pieces = grow(metaspace, text, cuts)
    assert any(ids != metaspace(text[:c])["input_ids"] for c, ids in zip(cuts, pieces, strict=True))


def test_the_probe_tells_which_tokenizers_split_alike(smollm2, bos_llama, metaspace):
    from s2l_sglang.stream.tokens import incremental_tokenization_works

    assert incremental_tokenization_works(smollm2)
    assert incremental_tokenization_works(bos_llama)
    assert not incremental_tokenization_works(metaspace)


def manager_over(tokenizer):
    from s2l_sglang.stream.manager import StreamManager

    tm = FakeTM()
    tm.tokenizer, tm.context_len = tokenizer, 1 << 20
    tm.model_config.vocab_size = len(tokenizer)
    return StreamManager(tm), tm


@pytest.mark.parametrize("name", ["smollm2", "bos_llama", "metaspace", "metaspace-forced"])
def test_final_prompt_is_the_whole_texts_tokenization(request, name):
    """`metaspace-forced`: the probe is overridden, so the finish's check must catch it."""
    tokenizer = request.getfixturevalue(name.split("-")[0])
    if name.startswith("metaspace"):
        text = "thecatsaton amatandthenitran farawayfromhome " * 14
    else:
        text = TEXT[:3000]
    pieces = [text[i : i + 37] for i in range(0, len(text), 37)]
    mgr, tm = manager_over(tokenizer)
    assert mgr._incremental is (name in ("smollm2", "bos_llama"))  # the start-up probe
    if name == "metaspace-forced":
        mgr._incremental = True

    async def run():
        await mgr.open("s", {"max_new_tokens": 1})
        for piece in pieces[:-1]:
            await mgr.append("s", piece)
            await mgr.streams["s"].pump  # FakeTM answers at once
        async for _ in await mgr.finish("s", pieces[-1]):
            pass

    asyncio.run(run())
    assert tm.turns[-1].rid.endswith("-final")
    assert replay(tm.turns) == tokenizer(text)["input_ids"]
    # only a tokenizer that splits differently in pieces turns the incremental path off
    assert mgr._incremental is (name in ("smollm2", "bos_llama"))


def replay(turns) -> list[int]:
    """The prompt the engine ends with: each turn keeps `offset` held tokens on a replace."""
    held: list[int] = []
    for t in turns:
        params = t.session_params or {}
        if params.get("replace"):
            held = held[: params["offset"]]
        held = held + list(t.input_ids)
    return held
