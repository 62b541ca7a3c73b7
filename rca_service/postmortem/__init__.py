"""Post-mortems: the same analysis over recorded spans, Flight Recorder dumps and trace backends."""
