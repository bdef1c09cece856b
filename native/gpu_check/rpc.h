// Shared by the GPU check's programs: an RPC server's device, for trying them where there is no GPU.
#pragma once

#include "ggml-backend.h"

#include <cstdio>

// registers the ggml-rpc backend of the server at endpoint ("host:port"); false (with a message) when this build
// has no RPC backend
static bool register_rpc_server(const char * endpoint) {
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    using add_server_t = ggml_backend_reg_t (*)(const char *);
    auto add_server = rpc ? (add_server_t) ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server") : nullptr;
    if (!add_server) {
        fprintf(stderr, "this build has no RPC backend\n");
        return false;
    }
    ggml_backend_register(add_server(endpoint));
    return true;
}
