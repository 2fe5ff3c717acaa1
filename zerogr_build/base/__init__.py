"""The neutral low level every layer may import; it imports nothing else of zerogr_build.

errors.py          ZerogrError / InputError / BundleError, one-line messages
progress.py        the Progress protocol long work reports through (NULL_PROGRESS: none)
device.py          device names: parsing, checking, identity keys, CUDA indexes (no torch at import)
device_probe.py    a device's identity read by a child process while this one works on
dtypes.py          dtype names (fp32, fp16, bf16) and their torch types
small_files.py     small files read whole: regular files only, size-limited; strict JSON
memory.py          large output buffers whose pages are mapped in bulk before they are written
memlimit.py        the memory this process may use (physical, ulimit -v, cgroup)
threads.py         a helper thread running an iterator one item ahead of its consumer
compile_notice.py  one notice when numba compiles (a cold first run)
redact.py          secrets kept out of messages: URL credentials, credential variables
printable.py       untrusted text made safe for a terminal (control characters escaped)
"""
