// API-key checks for the HTTP server. The comparison takes the same time wherever the first differing byte is,
// so that response timing does not reveal how much of a guessed key was right.
#pragma once

#include <string_view>

namespace deepinfer::server {

// True when `presented` equals `secret`. The loop always runs over the whole secret; only the length of the
// presented value (which the client already knows) and of the secret influence the time taken.
bool constant_time_equal(std::string_view presented, std::string_view secret);

// True when the Authorization header is "Bearer <key>" (scheme case-insensitive) or the x-api-key header is
// <key>. Both are compared in full (no early exit on the first header). An empty key matches nothing.
bool api_key_matches(std::string_view authorization, std::string_view x_api_key, std::string_view key);

}  // namespace deepinfer::server
