"""The applications built on the runtime: what the ``agentcell`` command runs.

- :mod:`runtime.apps.cli`: the ``agentcell`` command line (its subcommands below).
- :mod:`runtime.apps.demo`: ``agentcell demo``, concurrent sessions against the local provider.
- :mod:`runtime.apps.chat`: ``agentcell chat``, an interactive session.
- :mod:`runtime.apps.sessions_cli`: ``agentcell sessions``, the stored sessions.
- :mod:`runtime.apps.server`: ``agentcell serve``, the runtime over HTTP and Server-Sent Events.
- :mod:`runtime.apps.dashboard`: the live dashboard the server answers at ``/``.
- :mod:`runtime.apps.responses`: the OpenAI Responses API the server answers at ``/v1/``.

They use only the runtime's public API (and :mod:`runtime.served` for the server); nothing in the core
imports them.
"""

from typing import TYPE_CHECKING, Final, TypeAlias

if TYPE_CHECKING:
    from runtime.cluster import ClusterRuntime
    from runtime.host import Runtime

    AnyRuntime: TypeAlias = Runtime | ClusterRuntime
    """What a front serves: a local runtime or a cluster runtime (the same public API)."""

__all__ = ["LOCAL_API_KEY", "LOCAL_MODEL"]

LOCAL_MODEL: Final = "openai/agentcell-local"
"""The model name the apps use with the built-in local provider (``--local``): its built-in policy answers."""
LOCAL_API_KEY: Final = "sk-local"
"""The key the apps send the local provider (it checks none; litellm wants one)."""
