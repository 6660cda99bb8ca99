"""What a managed llama-server is given besides its command line (pure): its key, its
CORS, and an environment reduced to what it needs.

The server listens on a loopback port every local user and every sandbox sharing the
host's network can reach. Each start gets a fresh random key, in ``LLAMA_API_KEY``: the
server then refuses every request without it except ``/health`` (and ``/v1/health``),
which say only whether it is up. The key goes in the environment, never in argv, which
any local user can read in ``/proc/PID/cmdline``; ``/proc/PID/environ`` is readable by
the owner alone. CORS names one origin no page can have, so no browser page reads even
the public health answer, and a page never has the key to send.

The environment is an allow-list: what a process needs to run (search path, home,
locale, temporary folder), what the GPU runtimes and ggml read, and what the operator
names in ``server.pass_env``; never the gateway's cloud keys, token secret or database
URLs.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping

from boundedcode_gateway.config import SERVER_OWN_ENV

API_KEY_VAR = "LLAMA_API_KEY"
# an origin no page is served from (port 0): the server echoes it, never the caller's
CLOSED_ORIGIN = "http://127.0.0.1:0"
CLOSED_CORS_ENV: dict[str, str] = {
    "LLAMA_ARG_CORS_ORIGINS": CLOSED_ORIGIN,
    "LLAMA_ARG_CORS_CREDENTIALS": "false",
}
# set by the gateway on every start: neither the gateway's environment nor
# ``server.pass_env`` gives them to the server
OWN_NAMES = frozenset(SERVER_OWN_ENV)

# a process's basics: where programs and libraries are, whose home, which locale and zone
PASSED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "TMPDIR",
        "TEMP",
        "TMP",
        "TZ",
        "LANG",
        "LANGUAGE",
        "LD_LIBRARY_PATH",
        "DYLD_LIBRARY_PATH",
        "DYLD_FALLBACK_LIBRARY_PATH",
        "SYSTEMROOT",
        "WINDIR",
        # where -hf downloads go
        "LLAMA_CACHE",
        "XDG_CACHE_HOME",
        "HF_HOME",
        "HF_HUB_CACHE",
    }
)
# locale, ggml's own settings, and what the GPU and thread runtimes read
PASSED_PREFIXES = (
    "LC_",
    "GGML_",
    "CUDA_",
    "NVIDIA_",
    "__NV_",
    "HIP_",
    "ROCR_",
    "ROCM_",
    "HSA_",
    "GPU_DEVICE_ORDINAL",
    "VK_",
    "MESA_",
    "SYCL_",
    "ONEAPI_",
    "ZE_",
    "ZES_",
    "OMP_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "MKL_",
)
KEY_BYTES = 32


def new_api_key() -> str:
    """A fresh key for one start of a server (256 random bits)."""
    return secrets.token_urlsafe(KEY_BYTES)


def passed(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a variable of the gateway's environment goes to the server."""
    if name in OWN_NAMES:
        return False
    return name in PASSED_NAMES or name.startswith(PASSED_PREFIXES) or name in extra


def server_environment(
    parent: Mapping[str, str],
    settings_env: Mapping[str, str],
    api_key: str,
    pass_env: Iterable[str] = (),
) -> dict[str, str]:
    """The whole environment of one server start: the allowed part of ``parent``, the
    variables the gateway sets from the profile (``ServerCommand.env``), and the key."""
    extra = frozenset(pass_env)
    env = {name: value for name, value in parent.items() if passed(name, extra)}
    env.update(settings_env)
    env[API_KEY_VAR] = api_key
    return env
