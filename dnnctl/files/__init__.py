"""Files dnnctl reads and writes (plans, workloads, journals): strict YAML I/O, locked atomic
writes and the parse cache. Below plan / workloads / tune, which all use it."""
