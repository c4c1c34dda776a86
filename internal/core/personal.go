package core

// PersonalJob is one training of a device's personal adapter: the device's own
// scored steps, learned on top of the shared version it serves.
type PersonalJob struct {
	// Shared is the directory of the shared version's PEFT adapter the
	// personal one is trained on top of ("": the base model alone), and
	// SharedVersion its name ("v12"; "" with no shared version).
	Shared        string
	SharedVersion string
	// Prev is the directory of the personal adapter trained so far (""
	// starts a fresh one).
	Prev string
	// Steps are the device's scored steps to learn from; HeldBack are its
	// scored steps kept out of training, which the score is measured on.
	// Never another device's steps.
	Steps    []*Step
	HeldBack []*Step
	// Out is the directory, not existing yet, where the new personal
	// adapter is written (a PEFT adapter directory).
	Out string
	// Seed seeds the training.
	Seed uint64
}

// PersonalResult describes one training.
type PersonalResult struct {
	// Trained is the number of steps that took part in the update;
	// HeldBack the number of held-back steps scored.
	Trained  int `json:"trained"`
	HeldBack int `json:"held_back"`
	// ScoreBefore and ScoreAfter are the share of the held-back steps on
	// which the policy agrees with the user's reward (a liked reply more
	// likely than under the shared version alone, a disliked one less
	// likely), before and after this training; -1 when none was held back.
	ScoreBefore float64 `json:"score_before"`
	ScoreAfter  float64 `json:"score_after"`
	Seconds     float64 `json:"seconds"`
}
