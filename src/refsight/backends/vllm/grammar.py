"""The EBNF grammar of a JSON schema for vLLM's structured output (``structured_outputs.grammar``).

vLLM's default structured-output backend is xgrammar, which takes EBNF text; refsight writes
that text with xgrammar itself, imported only here and only when a vLLM request carries a
schema (``pip install '<checkout>[vllm]'``: xgrammar pulls ``triton``, GPU kernels a CPU
install never runs, so it is not a core dependency). The grammar constrains the way the
transformers backend's llguidance grammar does (:mod:`refsight.backends.hf.constrained`):
compact separators (``", "``, ``": "``), no free whitespace, objects closed unless they say
otherwise, numbers with a bound written with at most six decimals, and strings with
``maxLength`` written without escapes, control characters or surrogates, so the answer parses
under a strict JSON parser and each character costs at most 4 bytes.
"""

from __future__ import annotations

import json

__all__ = ["json_schema_ebnf"]

# xgrammar writes a string with maxLength as a run of this character class: no escapes,
# but raw control characters allowed (invalid JSON) ...
_BOUNDED_CHAR = r'[^\"\\\r\n]'
# ... so it is replaced with one that also refuses control characters and surrogates.
# The EBNF class decodes UTF-8 strictly (no overlong forms), unlike xgrammar's regex
# path for ``pattern``, which lets overlong 3-byte sequences through.
_STRICT_CHAR = r'[^\0-\x1f\"\\\uD800-\uDFFF]'


def json_schema_ebnf(schema: dict) -> str:
    """The EBNF text of ``schema``'s grammar: compact, strict JSON strings (see the module doc).

    Raises ValueError for a schema xgrammar cannot compile, and ImportError (naming the extra
    to install) when xgrammar is absent.
    """
    from ...support.extras import require

    xgr = require("xgrammar", "vllm", "a JSON schema on the vLLM backend")
    # any_whitespace=False: free whitespace would let a weak model pad forever and would
    # make the output length unbounded.
    text = json.dumps(schema, ensure_ascii=False)
    try:
        grammar = xgr.Grammar.from_json_schema(text, any_whitespace=False, strict_mode=True)
    except Exception as e:  # xgrammar raises RuntimeError/ValueError subclasses for bad schemas
        raise ValueError(f"cannot compile JSON schema into a grammar: {e}") from e
    ebnf = str(grammar)
    if _BOUNDED_CHAR in ebnf:
        ebnf = str(xgr.Grammar.from_ebnf(ebnf.replace(_BOUNDED_CHAR, _STRICT_CHAR)))
    return ebnf
