// POST /v1/completions and /v1/chat/completions.
//
//   parse + check the body (completion_request.h) -> tokenize the prompts (prompt_builder.h)
//   -> reserve queue slots (one per choice; over --max-queue: 503 + Retry-After)
//   -> submit one engine request per choice (GenerationJob; the engine's refusal is a 400 with
//      the field and code it names, SubmitResult::param / code)
//   -> stream: text/event-stream, `data: {chunk}` per engine output, `data: [DONE]`; the chunked
//      content provider polls the socket and cancels the job when the client is gone
//   -> or wait: poll for the client having closed (ClientConnection), answer when all choices end
#pragma once

#include "server/completion_request.h"
#include "server/server_state.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace specdec::server {

void handle_completion(ServerState& state, ApiKind kind, const httplib::Request& req,
                       httplib::Response& res);

}  // namespace specdec::server
