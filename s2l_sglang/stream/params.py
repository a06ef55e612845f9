"""Sampling parameters checked as SGLang checks them, before any engine work.

A stream's sampling parameters reach SGLang only with its final turn, after the whole context
was sent and prefilled. A bad one found there costs all that work and, before this check, came
back as a 500 or an event stream cut off mid-way (a `TypeError` inside SGLang's tokenizer
manager). So they are checked when the stream opens and again, merged with the finish's, when it
finishes: with SGLang's own `SamplingParams` class (the tokenizer manager's
`sampling_params_class`), its `normalize` and `verify`, after a type check of each given field
against that class's own annotations (SGLang's constructor, a msgspec struct, does not check
types; `stop: 5` or `max_new_tokens: "x"` fail only later).

A stream generates one output: `n` other than 1 (and beam search, `beam_width` > 1) is refused.
"""

from __future__ import annotations

from typing import Any

from s2l_sglang.stream.errors import InvalidSamplingParams

#: fields of SGLang's SamplingParams that SGLang fills in itself (normalize, __post_init__)
_INTERNAL = frozenset(
    {
        "stop_strs",
        "stop_regex_strs",
        "stop_str_max_len",
        "stop_regex_max_len",
        "is_normalized",
        "ebnf_full_assistant",
    }
)


def check_sampling_params(
    params: Any, sampling_params_class: type, tokenizer: Any, vocab_size: int, sid: str | None
) -> dict[str, Any]:
    """`params` checked as SGLang would check them at generation; returns a copy.

    Raises InvalidSamplingParams (400) naming the first bad field."""
    import msgspec

    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidSamplingParams("sampling_params must be a JSON object", sid)
    fields = {f.name: f for f in msgspec.structs.fields(sampling_params_class)}
    unknown = sorted(k for k in params if k not in fields or k in _INTERNAL)
    if unknown:
        raise InvalidSamplingParams(f"unknown sampling parameter {unknown[0]!r}", sid)
    for name, value in params.items():
        if value is None:
            continue  # SGLang's default (its __post_init__ treats null as "unset")
        try:
            msgspec.convert(value, fields[name].type)
        except (msgspec.ValidationError, TypeError) as exc:
            raise InvalidSamplingParams(f"sampling parameter {name!r}: {exc}", sid) from exc
    if params.get("n") not in (None, 1):
        raise InvalidSamplingParams("a stream generates one output: n must be 1", sid)
    if params.get("beam_width") not in (None, 1):
        raise InvalidSamplingParams("a stream generates one output: no beam search", sid)
    try:
        checked = sampling_params_class(**params)
        checked.normalize(tokenizer)
        checked.verify(vocab_size)
    except (ValueError, TypeError, msgspec.ValidationError) as exc:
        raise InvalidSamplingParams(f"invalid sampling parameters: {exc}", sid) from exc
    return dict(params)
