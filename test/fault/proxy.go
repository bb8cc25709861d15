package fault

import (
	"net"
	"sync"

	"k8s.io/client-go/tools/clientcmd"
)

// Proxy is a TCP proxy to the apiserver that a test controls, for network
// partitions between one client and the control plane: while partitioned,
// bytes in both directions are held (connections stay open, requests hang,
// as behind a dropped route) and new connections wait; Heal lets everything
// flow again. TLS passes through untouched.
type Proxy struct {
	Addr string // host:port to dial instead of the apiserver

	ln     net.Listener
	target string
	mu     sync.Mutex
	open   *sync.Cond
	cut    bool
	closed bool
	conns  map[net.Conn]struct{}
}

// NewProxy listens on 127.0.0.1 and forwards to target (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.open = sync.NewCond(&p.mu)
	go p.accept()
	return p, nil
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	if !p.waitOpen() {
		_ = c.Close()
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(up, c) }()
	go func() { defer wg.Done(); p.pipe(c, up) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// pipe copies src to dst, holding each chunk while the proxy is partitioned.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitOpen() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF included: the other side closes too
			return
		}
	}
}

func (p *Proxy) waitOpen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.cut && !p.closed {
		p.open.Wait()
	}
	return !p.closed
}

// Partition holds all traffic until Heal.
func (p *Proxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
}

// Heal lets traffic flow again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	p.open.Broadcast()
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.open.Broadcast()
	p.mu.Unlock()
	_ = p.ln.Close()
}

// Through returns kubeconfig (its bytes) with every cluster's server set to
// the proxy, so a client or process reaches the apiserver through it.
func (p *Proxy) Through(kubeconfig []byte) ([]byte, error) {
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return nil, err
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + p.Addr
	}
	return clientcmd.Write(*cfg)
}
