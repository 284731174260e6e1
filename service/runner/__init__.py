"""What every job runner shares, whatever the job's kind: how the process steers a run (control.py), when a run
stops (stopping.py, every stop reason), how it ends (finish.py, with the one signature runners have) and the seeds
that make a resumed run pick what the uninterrupted one would have (seeding.py)."""
