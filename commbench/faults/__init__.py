"""Failures on purpose (--fail) and recovering from them (--recovery): the schedule, its
firing, checkpoints, the restart and the supervisor that starts a job again."""
