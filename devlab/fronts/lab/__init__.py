"""The notebook lab: magics, widgets, lessons and exercises, thin over devlab.core."""
