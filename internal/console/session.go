package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net"
	"net/http"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
)

// cookieName is the session cookie. Its value is the session's id: a
// random 256-bit secret, never derived from the bearer token, which stays
// on the server.
const cookieName = "intentd_console"

// maxSessions bounds the session store: past it, signing in is refused
// until sessions expire (expired ones are swept first).
const maxSessions = 10_000

// session is one browser's stay. Every visitor has one (the CSRF token of
// the sign-in form lives in it); signing in rotates it to a new id and
// gives it the principal's bearer token. Nothing of it is in the URL.
type session struct {
	id   string
	csrf string
	// token is the bearer token the API calls carry; empty before signing
	// in, and always without authentication.
	token string
	// actor is the reviewer's name when authentication is off (asked in
	// the decide form and remembered).
	actor            string
	created, lastUse time.Time
	// flash is a one-time message for the next page (after a redirect).
	flash string
}

// sessions is the server-side store. A session ends after idle time
// without a request, or at maxAge after signing in, whichever comes first;
// signing out ends it at once. The store is per replica: behind a load
// balancer, pin a browser to one replica (or sign in again).
type sessions struct {
	idle, maxAge time.Duration
	now          func() time.Time
	mu           sync.Mutex
	byID         map[string]*session
}

func newSessions(idle, maxAge time.Duration, now func() time.Time) *sessions {
	return &sessions{idle: idle, maxAge: maxAge, now: now, byID: map[string]*session{}}
}

func randomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand's contract)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (s *sessions) expired(ss *session, now time.Time) bool {
	return now.Sub(ss.lastUse) > s.idle || now.Sub(ss.created) > s.maxAge
}

// get returns the request's live session, touching it, or nil.
func (s *sessions) get(r *http.Request) *session {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.byID[c.Value]
	if ss == nil {
		return nil
	}
	if s.expired(ss, now) {
		delete(s.byID, ss.id)
		return nil
	}
	ss.lastUse = now
	return ss
}

// create stores a new session and sets its cookie; nil when the store is
// full of live sessions.
func (s *sessions) create(w http.ResponseWriter, r *http.Request, token string) *session {
	now := s.now()
	ss := &session{id: randomID(), csrf: randomID(), token: token, created: now, lastUse: now}
	s.mu.Lock()
	if len(s.byID) >= maxSessions {
		for id, o := range s.byID {
			if s.expired(o, now) {
				delete(s.byID, id)
			}
		}
	}
	full := len(s.byID) >= maxSessions
	if !full {
		s.byID[ss.id] = ss
	}
	s.mu.Unlock()
	if full {
		return nil
	}
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: ss.id, Path: Path, MaxAge: int(s.maxAge / time.Second),
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode,
	})
	return ss
}

// end removes ss and clears its cookie.
func (s *sessions) end(w http.ResponseWriter, r *http.Request, ss *session) {
	s.mu.Lock()
	delete(s.byID, ss.id)
	s.mu.Unlock()
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: "", Path: Path, MaxAge: -1,
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode,
	})
}

// setFlash and takeFlash pass a message to the page after a redirect.
func (s *sessions) setFlash(ss *session, msg string) {
	s.mu.Lock()
	ss.flash = msg
	s.mu.Unlock()
}

func (s *sessions) takeFlash(ss *session) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := ss.flash
	ss.flash = ""
	return m
}

func (s *sessions) setActor(ss *session, actor string) {
	s.mu.Lock()
	ss.actor = actor
	s.mu.Unlock()
}

// signinFailures limits wrong tokens per client address: signInBurst at
// once, then one per signInEvery, so that guessing tokens through the form
// is slow (the tokens themselves are long and random; this is against
// their leaking in part). The most recent maxSessions addresses are kept.
type signinFailures struct {
	byAddr *lru.Cache[string, *rate.Limiter]
}

const (
	signInBurst = 5
	signInEvery = 12 * time.Second
)

func newSigninFailures() *signinFailures {
	c, _ := lru.New[string, *rate.Limiter](maxSessions) // fails only for a size <= 0
	return &signinFailures{byAddr: c}
}

// of returns the limiter of r's client address (without its port).
func (f *signinFailures) of(r *http.Request) *rate.Limiter {
	addr, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		addr = r.RemoteAddr
	}
	l, ok := f.byAddr.Get(addr)
	if !ok {
		l = rate.NewLimiter(rate.Every(signInEvery), signInBurst)
		f.byAddr.Add(addr, l)
	}
	return l
}

// checkCSRF reports whether the form carries the session's CSRF token.
func checkCSRF(ss *session, r *http.Request) bool {
	got := r.PostFormValue("csrf")
	return ss != nil && got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(ss.csrf)) == 1
}

// secure reports whether the browser reached the console over TLS: its
// own, or a proxy's that says so.
func secure(r *http.Request) bool {
	return r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https"
}
