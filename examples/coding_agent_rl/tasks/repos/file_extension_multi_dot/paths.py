def extension(filename):
    """The text after the last '.' of `filename`, or '' when there is none."""
    if "." not in filename:
        return ""
    return filename.split(".")[1]
