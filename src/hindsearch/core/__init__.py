"""The model core: what every forward a model runs outside TRL's training step goes through.

It imports nothing else of hindsearch (torch and transformers only; ``tests/test_layout.py``), so
every layer above may use it:

- ``core.model``: padding and positions, the pad id, forwards, KV caches (save, resume, merge,
  shared prefixes);
- ``core.sampling``: ``SamplingParams``, top-p, ``sample_tokens``, ``GenOutput`` and THE stop rule;
- ``core.decode``: THE decode loop (rows with pending-token queues and an ``on_stop`` callback);
- ``core.scoring``: teacher-forced continuation log-probs;
- ``core.lockstep``: the lockstep of several processes, opened by ``core.decode`` and
  ``core.scoring`` around all their forwards, so no caller needs to know about it.
"""
