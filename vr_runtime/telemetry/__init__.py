"""What a request costs and how far along it is: per-stage timers (:mod:`.timing`), memory
(:mod:`.memory`, with NVML's device mapping in :mod:`.nvml`) and the terminal status line
(:mod:`.progress`)."""
