"""The compare pipeline: recall → attribute prefilter → rerank → judge, each stage timed and counted.

:class:`ComparePipeline` is what :meth:`refsight.Engine.compare` runs, built once from the
engine's parts (it never sees the engine). The stages:

1. **recall** (with ``top_k``): the store index returns ``recall_k or rerank or top_k`` references for the
   query vector built from the candidate image and/or the recall text
   (:mod:`refsight.retrieval.query`); without ``top_k`` the given ``ref_ids`` are the shortlist.
2. **prefilter**: references whose *stored* attribute records settle a required criterion as a
   mismatch are dropped (``stage: "filtered"``, ``filtered_by``) before any VLM work
   (:mod:`refsight.judge.prefilter`).
3. **rerank** (with ``rerank``): a :class:`~refsight.compare.rerank.Reranker` scores the best ``rerank``
   survivors (by recall score) and the ``top_k`` best go on; the rest are reported with
   ``stage: "reranked"`` (and survivors beyond ``rerank``, or beyond ``top_k`` without a
   reranker, with ``stage: "recalled"``).
4. **judge**: criterion-by-criterion verdicts (:class:`~refsight.judge.Judge`) for the finalists.

Results are sorted (:func:`sort_results`): judged references by score (ties by rerank score,
then recall score), then reranked-only ones by rerank score, then filtered ones. ``stages``
counts the references each stage took in; ``timings_ms`` times every stage that ran, under
its name (:data:`refsight.results.COMPARE_STAGES`).

- :class:`refsight.requests.CompareRequest`: the knobs of one compare and the rules between them
  (checked once when a front door builds it);
- :mod:`.pipeline`: :class:`ComparePipeline`, the stages;
- :mod:`.rows`: the result rows and their order.
"""

from .pipeline import ComparePipeline
from .rows import REACHED, sort_results

__all__ = ["ComparePipeline", "REACHED", "sort_results"]
