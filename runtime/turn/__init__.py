"""The agent's turns as a sans-I/O state machine (design §3.1): what happened in, what to do next out.

:class:`TurnMachine` is the machine (:mod:`runtime.turn.machine`: the inputs and a turn's flows, over
:mod:`runtime.turn.recovery` and :mod:`runtime.turn.core`); :mod:`runtime.turn.effects` what it asks for and
what it is told; :mod:`runtime.turn.state` the agent's states and a turn's record; :mod:`runtime.turn.fit`
the window-fitting rules. The ``Agent`` actor is its driver.
"""

from runtime.turn.machine import CLIENT_TOOL_CLASH, TurnMachine
from runtime.turn.state import TRANSITIONS, AgentState, Handover, IllegalTransition, TurnState

__all__ = [
    "CLIENT_TOOL_CLASH",
    "TRANSITIONS",
    "AgentState",
    "Handover",
    "IllegalTransition",
    "TurnMachine",
    "TurnState",
]
