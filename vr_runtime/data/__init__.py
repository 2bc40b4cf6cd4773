"""Data both evaluation and training read and write: all-or-nothing file writes
(:mod:`.atomic`), JSON-lines files (:mod:`.jsonl`) and the synthetic videos with known answers
and relevant frames (:mod:`.synthetic_videos`). It imports nothing above it."""
