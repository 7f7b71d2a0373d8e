"""The peers the benchmarks measure bertgpu against, each in its own file (run as a process or imported)."""
