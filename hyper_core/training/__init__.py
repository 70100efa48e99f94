"""Loss, optimizer and LR schedules used by the default build stages."""
