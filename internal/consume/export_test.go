package consume

// Turns is how many times the pull loops of p waited for something to do.
func (p *Pool) Turns() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, s := range p.sources {
		n += s.turns.Load()
	}
	return n
}
