"""What the routes send back, whatever their dialect: a generation as answered (:mod:`.answers`), its tokens'
log probabilities (:mod:`.logprob_fields`), llama-server's ``timings`` (:mod:`.timings`), server-sent events
(:mod:`.streaming`) and a running compare's stage (:mod:`.progress`). Below the intake and above the edge:
nothing here reads a request body.
"""

__all__: list[str] = []
