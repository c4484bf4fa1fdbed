"""The machine: CPU topology from /sys, the thread plan, pinning, NUMA placement and the
memory bandwidth probe."""
