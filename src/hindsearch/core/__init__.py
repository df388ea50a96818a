"""The model core: what every forward a model runs outside TRL's training step goes through.

It imports nothing else of hindsearch (torch and transformers only; ``tests/test_layout.py``), so
every layer above may use it: ``core.model`` (padding, positions, the pad id, forwards, KV caches),
``core.sampling`` (``SamplingParams``, top-p, ``GenOutput``, THE stop rule), ``core.decode`` (THE
decode loop), ``core.scoring`` (teacher-forced continuation log-probs) and ``core.lockstep`` (the
lockstep of several processes, opened by ``core.decode`` and ``core.scoring`` around all their
forwards, so no caller needs to know about it).
"""
