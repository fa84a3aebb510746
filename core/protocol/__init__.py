"""Request and response formats of the HTTP API, one module per API family.

Each request body (pydantic) has `to_generation()`, the one place it becomes a
`GenerationRequest`, and `reply()`, which builds its answer: the whole JSON body, or the
events of a stream. Each module also holds its routes' answers, which core.routes' table
names; `core.api` routes to them, `core.service` runs what they ask for.

- `serving`: what a format knows of the server (`Served`), and `Reply`, how a route
  answers one generation (a JSON body or a stream's events).
- `bodies`: `Body`, the base of every request body, the generation fields they share,
  and `parse` (bytes to a body, or a 400 naming the field).
- `replies`: the JSON shapes of every answer (TypedDicts, in the OpenAPI document).
- `native`: POST /generate.
- `openai`: what OpenAI's routes share; POST /v1/completions, GET /v1/models.
- `chat`: POST /v1/chat/completions (OpenAI's chat).
- `responses`: POST /v1/responses (OpenAI's Responses API).
- `ollama`: POST /api/generate and /api/chat, and the model routes of Ollama's API.
- `tools`: tool calling (OpenAI's and Ollama's `tools`).
"""
