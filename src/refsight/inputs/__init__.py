"""The intake and hostile-input primitives every front end applies before any work (re-exported by :mod:`refsight`).

* :mod:`~refsight.inputs.images` – an image decoded, bounded, oriented and hashed: what the encoder will see;
* :mod:`~refsight.inputs.rubric` – a rubric as people write it, parsed into checked criteria;
* :mod:`~refsight.inputs.prompt_size` – a prompt's tokens, text and images together, checked before any prefill;

* :mod:`~refsight.inputs.reading` – a user-named file read only if regular, never blocking, never past its limit;
* :mod:`~refsight.inputs.jsonlimits` – JSON depth measured without recursion, values counted, YAML bounded while parsed;
* :mod:`~refsight.inputs.text` – text that must be valid Unicode;
* :mod:`~refsight.inputs.terminal` – control characters escaped for a terminal;
* :mod:`~refsight.inputs.json_schema` – a JSON schema bounded before any grammar is built (with
  :mod:`~refsight.inputs.schema_regex`, its patterns' size);
* :mod:`~refsight.inputs.gbnf` – a GBNF grammar read whole, as llama.cpp reads it, before any runtime compiles it
  (with :mod:`~refsight.inputs.gbnf_syntax`, its parser, and :mod:`~refsight.inputs.gbnf_rules`, its rules' checks);
* :mod:`~refsight.inputs.ref_ids` – a reference id safe as a key and a file name.
"""
