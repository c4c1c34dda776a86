package engine

import (
	"errors"
	"testing"

	"github.com/clawmesh/clawmesh/model/loss"
)

func TestTrainSampleValidate(t *testing.T) {
	ok := TrainSample{Tokens: []int{1, 2, 3}, LossMask: []bool{false, true, true}, Advantages: []float32{0, 1, 1}}
	if err := ok.Validate(10); err != nil {
		t.Fatalf("valid sample: %v", err)
	}
	bad := map[string]TrainSample{
		"one token":    {Tokens: []int{1}, LossMask: []bool{true}, Advantages: []float32{1}},
		"mask":         {Tokens: []int{1, 2}, LossMask: []bool{true}, Advantages: []float32{1, 1}},
		"advantages":   {Tokens: []int{1, 2}, LossMask: []bool{true, true}, Advantages: []float32{1}},
		"old logprobs": {Tokens: []int{1, 2}, LossMask: []bool{true, true}, Advantages: []float32{1, 1}, OldLogprobs: []float32{0}},
		"ref logprobs": {Tokens: []int{1, 2}, LossMask: []bool{true, true}, Advantages: []float32{1, 1}, RefLogprobs: []float32{0, 0, 0}},
		"token range":  {Tokens: []int{1, 10}, LossMask: []bool{true, true}, Advantages: []float32{1, 1}},
		"negative":     {Tokens: []int{-1, 2}, LossMask: []bool{true, true}, Advantages: []float32{1, 1}},
	}
	for name, s := range bad {
		if err := s.Validate(10); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func TestRecipe(t *testing.T) {
	d := Recipe{}.WithDefaults()
	if d.LR != DefaultLR || d.Beta1 != 0.9 || d.Beta2 != 0.999 || d.Eps != 1e-8 || d.MaxGradNorm != 1 || d.MicroBatch != DefaultMicroBatch {
		t.Fatalf("defaults %+v", d)
	}
	if err := (Recipe{}).Validate(); err != nil {
		t.Fatalf("zero recipe: %v", err)
	}
	for name, r := range map[string]Recipe{
		"lr":    {LR: -1},
		"beta1": {Beta1: 1},
		"wd":    {WeightDecay: -0.1},
		"micro": {MicroBatch: -2},
		"loss":  {Loss: loss.Config{EpsLow: 2}},
	} {
		if err := r.Validate(); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}
