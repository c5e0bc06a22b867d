"""The gateway's transports: ``litellm`` (every provider) and ``openai_compat`` (native, OpenAI chat
completions over httpx). See :mod:`runtime.gateway.transports.base` for the interface."""
