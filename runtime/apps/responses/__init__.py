"""An OpenAI Responses API front door for ``agentcell serve``: any OpenAI client talks to agentcell sessions.

    GET    /v1/models, /v1/models/{id}            the agent profiles and configured models
    POST   /v1/responses                          a response: starts a session, or continues one
    POST   /v1/responses/input_tokens             the tokens an input would come to
    POST   /v1/responses/compact                  a session compacted; the window that goes on from it
    GET    /v1/responses/{id}                     a stored response
    DELETE /v1/responses/{id}
    POST   /v1/responses/{id}/cancel              stop one in progress (its turn is aborted)
    GET    /v1/responses/{id}/input_items
    POST   /v1/conversations                      {"items", "metadata"}
    GET    /v1/conversations/{id}, POST (metadata), DELETE
    GET    /v1/conversations/{id}/items, POST {"items"}, GET and DELETE .../items/{item_id}

The server's bearer token is the API key. A response without ``previous_response_id`` or ``conversation``
starts a session; with one, it continues that session from where that response (or the conversation)
left it: a response id is a point of the session's tree, and continuing from an older one branches.
``instructions`` is the system prompt (kept by the session when a later request gives none); ``model`` is
any model agentcell can call, or the name of an agent profile (``[agents.NAME]``: its model, system
prompt, tools and config). ``truncation: "auto"`` (the default here) keeps the context inside the window
by compaction; ``"disabled"`` makes an overflow an error. ``context_length_exceeded`` is answered only
when compaction could not help.

Function tools declared in ``tools`` run on the client: the run stops after the model's calls to them,
the response completes with their ``function_call`` items, and the next request's
``function_call_output`` items continue the same thread (see ``actors.protocol.TurnOptions``). The session's
own tools run on the server and appear as ``mcp_call`` items (``server_label`` ``agentcell``) with
their output.

Modules: :mod:`.items` (items ↔ messages), :mod:`.api` (request, response, usage and error shapes),
:mod:`.stream` (events → the API's stream events), :mod:`.sealing` (reasoning and compaction points sealed
for a client to hold) and :mod:`.threads` (which session a stateless client's request goes on with) are
pure; :mod:`.records` keeps responses and conversations on disk; :mod:`.door` prepares a response,
orders it on its session and keeps what it leaves; :mod:`.runs` runs its turn on the session;
:mod:`.compaction` is ``responses.compact``; :mod:`.catalog` answers models and token counts; :mod:`.routes`
is the HTTP side.
"""

from runtime.apps.responses.routes import RequestIds, responses_routes

__all__ = ["RequestIds", "responses_routes"]
