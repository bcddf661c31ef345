package dashboard

// DurationText is how the pages print a duration, for tests that compare.
var DurationText = durationText
