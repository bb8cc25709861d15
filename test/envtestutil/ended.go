package envtestutil

import "time"

// ended carries how a process or a manager ended. It is set once; reading
// it leaves it in place, so every later reader sees it too.
type ended chan error

func newEnded() ended { return make(ended, 1) }

// peek returns the end if it has come.
func (e ended) peek() (bool, error) {
	select {
	case err := <-e:
		e <- err
		return true, err
	default:
		return false, nil
	}
}

// wait waits up to d for the end.
func (e ended) wait(d time.Duration) (bool, error) {
	select {
	case err := <-e:
		e <- err
		return true, err
	case <-time.After(d):
		return false, nil
	}
}
