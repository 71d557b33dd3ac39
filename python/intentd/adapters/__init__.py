"""Adapters of guarded tools (:mod:`intentd.guard`) to agent frameworks,
each an optional extra that imports its framework only when imported:

- :mod:`intentd.adapters.langchain` — LangChain / LangGraph agents: tool-call
  middleware beside ``HumanInTheLoopMiddleware`` (``pip install 'intentd[langchain]'``)
- :mod:`intentd.adapters.pydantic_ai` — Pydantic AI: a capability around tool
  execution, with deferred-tool approvals (``pip install 'intentd[pydantic-ai]'``)
- :mod:`intentd.adapters.openai_agents` — the OpenAI Agents SDK: function tools
  with ``needs_approval`` and the run state's approvals (``pip install 'intentd[openai-agents]'``)

In each, the host's approval step registers the approved terms
(:meth:`intentd.Ledger.approve`) and the tool call acquires with their
fingerprint (:meth:`intentd.Ledger.call`); identity comes from the host's
own context object and the tool's arguments, never from the framework's
tool-call id.
"""
