"""The engine: step loop, scheduler, slots, sequences and their output."""
