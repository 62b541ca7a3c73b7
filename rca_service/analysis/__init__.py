"""Analysis: triggers, the wait-for graph and the verdict: pure functions from job state to findings."""
