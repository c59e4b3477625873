package netns

// PrepareDirAgain is PrepareDir without the per-process memory: what
// another process preparing the same directory does.
var PrepareDirAgain = prepareDir
