def format_duration(seconds):
    """'1h 02m 03s' for 3723 seconds."""
    hours = seconds // 3600
    minutes = seconds % 60
    secs = seconds % 60
    return f"{hours}h {minutes:02d}m {secs:02d}s"
