"""A second model of NCCL, written from NCCL's source (issue 44): progress.py (proxy send / receive
progress, the step window, clear-to-send, rings over NET and P2P hops), cluster.py (8 hosts x 4 GPUs,
the job, the faults, the telemetry the instrumentation's encoders build) and drive.py (the RCA engine
fed on the model's clock, through the OTLP wire format, and scored)."""
