package adapters

// SetStepHook makes fn run at each step of an install.
func SetStepHook(f *Follower, fn func(step string)) { f.at = fn }
