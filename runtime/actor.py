"""Pooled actors. PLACEHOLDER until the actor-core work lands: same contract as pykka.ThreadingActor."""

from __future__ import annotations

import pykka

PooledActor = pykka.ThreadingActor
