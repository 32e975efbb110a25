"""Hostile-input primitives every front end applies before any work (re-exported by :mod:`refsight`).

* :mod:`~refsight.inputs.reading` – a user-named file read only if regular, never blocking, never past its limit;
* :mod:`~refsight.inputs.jsonlimits` – JSON depth measured without recursion, values counted, YAML bounded while parsed;
* :mod:`~refsight.inputs.text` – text that must be valid Unicode;
* :mod:`~refsight.inputs.terminal` – control characters escaped for a terminal.
"""
