"""An AnarchonJob: its spec, its controller and status, its triggers and missed slots, its watch."""
