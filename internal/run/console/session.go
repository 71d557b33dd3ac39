package console

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
)

// cookieName is the session cookie. Its value is the session's secret: 256
// random bits, never derived from the bearer token, which stays on the
// server.
const cookieName = "intentd_console"

// maxSessions bounds the signed-in sessions of the whole installation
// (every replica counts the same store): past it, signing in is refused
// until sessions end. Visitors who have not signed in hold none: their
// only state is their cookie (see session).
const maxSessions = 10_000

// SessionStore keeps the console's sessions where every replica of intentd
// sees them (etcd: etcdstore.ConsoleSessions), so that a reviewer stays
// signed in whichever replica a load balancer picks, and a sign-out on one
// ends the session on all of them. It stores opaque bytes by an opaque
// name: the console seals each session under a key derived from the
// cookie's secret and names it by the secret's SHA-256, so that nothing
// the store holds signs anyone in or reveals a bearer token.
type SessionStore interface {
	// Create stores a new session that ends by itself after ttl without a
	// Refresh.
	Create(ctx context.Context, id string, sealed []byte, ttl time.Duration) error
	// Get returns the session, nil when there is none (ended, or idle past
	// its ttl). A session ended on another replica is gone here too.
	Get(ctx context.Context, id string) ([]byte, error)
	// Put replaces the session while it exists; ok is false when it ended
	// (and nothing is written: an ended session never comes back).
	Put(ctx context.Context, id string, sealed []byte) (ok bool, err error)
	// Refresh is Put that also restarts the session's ttl.
	Refresh(ctx context.Context, id string, sealed []byte) (ok bool, err error)
	// Delete ends the session on every replica.
	Delete(ctx context.Context, id string) error
	// Count returns how many sessions there are, on every replica.
	Count(ctx context.Context) (int64, error)
}

// session is one browser's stay. Every visitor has one: its secret is the
// cookie, from which the CSRF token of its forms is derived, so that the
// sign-in form needs nothing stored. Signing in rotates it to a new secret
// and stores it with the principal's bearer token; without
// authentication it is stored once there is something to remember (the
// actor's name, a message for the next page). Nothing of it is in a URL.
type session struct {
	// secret is the cookie's value, decoded; name is the hex SHA-256 of
	// it, the session's name in the store.
	secret []byte
	name   string
	csrf   string
	// stored: the store holds this session (signed in, or remembering).
	stored bool
	// token is the bearer token the API calls carry; empty before signing
	// in, and always without authentication.
	token string
	// actor is the reviewer's name when authentication is off (asked in
	// the decide form and remembered).
	actor string
	// created is when the session began (signing in): it ends maxAge
	// later. refreshed is when its idle timer last restarted.
	created, refreshed time.Time
	// flash is a one-time message for the next page (after a redirect,
	// which may land on another replica).
	flash string
}

// sealedSession is what the store keeps of a session, sealed.
type sealedSession struct {
	Token     string    `json:"token,omitempty"`
	Actor     string    `json:"actor,omitempty"`
	Created   time.Time `json:"created"`
	Refreshed time.Time `json:"refreshed"`
	Flash     string    `json:"flash,omitempty"`
}

// sessions keeps the sessions in a SessionStore. A session ends after idle
// time without a request (the store's ttl, restarted at most every
// refreshEvery, so it may end up to that much sooner), or at maxAge after
// signing in, whichever comes first; signing out, or the token leaving
// the tokens file, ends it at once on every replica.
type sessions struct {
	store                      SessionStore
	idle, maxAge, refreshEvery time.Duration
	now                        func() time.Time
	log                        *slog.Logger
}

func newSessions(store SessionStore, idle, maxAge time.Duration, now func() time.Time, log *slog.Logger) *sessions {
	// About once a minute per session, not on every request: a busy
	// reviewer costs one etcd read per page, and one write a minute.
	return &sessions{store: store, idle: idle, maxAge: maxAge, refreshEvery: min(time.Minute, idle/4), now: now, log: log}
}

// storeTimeout bounds a session write made outside a request's own
// context (after the page was chosen).
const storeTimeout = 10 * time.Second

func randomSecret() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand's contract)
	return b
}

// randomID is a random token for forms (request ids).
func randomID() string { return base64.RawURLEncoding.EncodeToString(randomSecret()) }

// newSession is the session of secret, with nothing stored yet.
func newSession(secret []byte) *session {
	h := sha256.Sum256(secret)
	return &session{secret: secret, name: hex.EncodeToString(h[:]), csrf: base64.RawURLEncoding.EncodeToString(derive(secret, "intentd console csrf v1"))}
}

// derive is a 256-bit key for purpose from a session's secret
// (HKDF-SHA256): the sealing key and the CSRF token are both the
// secret's, and neither tells anything of it or of the other.
func derive(secret []byte, purpose string) []byte {
	k, err := hkdf.Key(sha256.New, secret, nil, purpose, 32)
	if err != nil {
		panic("console: hkdf: " + err.Error()) // only for a length beyond 255 hashes
	}
	return k
}

// sealVersion is the first byte of a sealed session: the format.
const sealVersion = 1

// seal encrypts ss's record with AES-256-GCM under a key derived from its
// secret, bound to its name: only the holder of the cookie can open it.
func (ss *session) seal() ([]byte, error) {
	plain, err := json.Marshal(sealedSession{Token: ss.token, Actor: ss.actor, Created: ss.created, Refreshed: ss.refreshed, Flash: ss.flash})
	if err != nil {
		return nil, err
	}
	aead := ss.aead()
	out := make([]byte, 1+aead.NonceSize(), 1+aead.NonceSize()+len(plain)+aead.Overhead())
	out[0] = sealVersion
	_, _ = rand.Read(out[1:]) // a random nonce per seal; never fails
	return aead.Seal(out, out[1:], plain, []byte(ss.name)), nil
}

// open decrypts a sealed session of ss's secret into ss.
func (ss *session) open(sealed []byte) error {
	aead := ss.aead()
	if len(sealed) < 1+aead.NonceSize() || sealed[0] != sealVersion {
		return errors.New("console: sealed session of an unknown format")
	}
	plain, err := aead.Open(nil, sealed[1:1+aead.NonceSize()], sealed[1+aead.NonceSize():], []byte(ss.name))
	if err != nil {
		return fmt.Errorf("console: sealed session does not open: %w", err)
	}
	var rec sealedSession
	if err := json.Unmarshal(plain, &rec); err != nil {
		return fmt.Errorf("console: sealed session: %w", err)
	}
	ss.token, ss.actor, ss.created, ss.refreshed, ss.flash = rec.Token, rec.Actor, rec.Created, rec.Refreshed, rec.Flash
	return nil
}

func (ss *session) aead() cipher.AEAD {
	block, err := aes.NewCipher(derive(ss.secret, "intentd console session seal v1"))
	if err != nil {
		panic("console: aes: " + err.Error()) // only for a key of another size
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic("console: gcm: " + err.Error())
	}
	return aead
}

// secretOf is the secret a request's cookie carries, nil without a
// well-formed one.
func secretOf(r *http.Request) []byte {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil || len(b) != 32 {
		return nil
	}
	return b
}

// requestSession carries a request's session from withSession to the
// handlers: the store is read once per request.
type requestSession struct{ ss *session }

type sessionKey struct{}

// withSession reads the request's session from the store before next runs
// (static files need none). When the store does not answer, nobody can
// tell who is signed in: the page says so rather than send a signed-in
// reviewer to the sign-in form.
func (c *Console) withSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, Path+"static/") {
			next.ServeHTTP(w, r)
			return
		}
		ss, err := c.sessions.load(r.Context(), secretOf(r))
		if err != nil {
			c.cfg.Log.Warn("console: reading the session failed", "err", err)
			c.problem(w, r, nil, http.StatusServiceUnavailable, "intentd cannot reach its store",
				"The console could not read your session from intentd's store. Reload in a moment; nothing was changed, and you stay signed in.")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, &requestSession{ss: ss})))
	})
}

// load returns the live session of secret (nil secret: no session), a
// visitor's if the store holds none for it, touching it.
func (s *sessions) load(ctx context.Context, secret []byte) (*session, error) {
	if secret == nil {
		return nil, nil
	}
	ss := newSession(secret)
	sealed, err := s.store.Get(ctx, ss.name)
	if err != nil || sealed == nil {
		return ss, err
	}
	if err := ss.open(sealed); err != nil {
		// Not this secret's (or damaged): nothing it holds is trusted.
		s.log.Warn("console: a stored session does not open; ending it", "err", err)
		_ = s.store.Delete(ctx, ss.name)
		return newSession(secret), nil
	}
	now := s.now()
	if now.Sub(ss.created) > s.maxAge || now.Sub(ss.refreshed) > s.idle {
		// The store's ttl ends idle sessions by etcd's clock; this ends
		// them by the console's too, and ends them at their maximum age.
		_ = s.store.Delete(ctx, ss.name)
		return newSession(secret), nil
	}
	ss.stored = true
	if last := ss.refreshed; now.Sub(last) >= s.refreshEvery {
		ss.refreshed = now
		b, err := ss.seal()
		if err != nil {
			return nil, err
		}
		ok, err := s.store.Refresh(ctx, ss.name, b)
		switch {
		case err != nil:
			// Still live until its ttl: the next request tries again.
			s.log.Warn("console: refreshing a session failed", "err", err)
			ss.refreshed = last
		case !ok: // ended since the read, on some replica
			return newSession(secret), nil
		}
	}
	return ss, nil
}

// get returns the request's session, or nil when it has none.
func (s *sessions) get(r *http.Request) *session {
	if rs, ok := r.Context().Value(sessionKey{}).(*requestSession); ok {
		return rs.ss
	}
	ss, err := s.load(r.Context(), secretOf(r)) // outside withSession
	if err != nil {
		s.log.Warn("console: reading the session failed", "err", err)
		return nil
	}
	return ss
}

// errTooManySessions refuses a sign-in past maxSessions.
var errTooManySessions = errors.New("console: too many sessions")

// create starts a new session and sets its cookie: with a token, stored
// (signed in); without one, a visitor's, stored only when it has
// something to remember. nil when it could not be stored (see start).
func (s *sessions) create(w http.ResponseWriter, r *http.Request, token string) *session {
	ss, err := s.start(w, r, token)
	if err != nil {
		return nil
	}
	return ss
}

// start is create, saying why a session could not be stored: too many
// sessions (errTooManySessions), or the store did not answer.
func (s *sessions) start(w http.ResponseWriter, r *http.Request, token string) (*session, error) {
	ss := newSession(randomSecret())
	if token != "" {
		ss.token = token
		if err := s.put(r.Context(), ss); err != nil {
			return nil, err
		}
	}
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: base64.RawURLEncoding.EncodeToString(ss.secret), Path: Path, MaxAge: int(s.maxAge / time.Second),
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode,
	})
	if rs, ok := r.Context().Value(sessionKey{}).(*requestSession); ok {
		rs.ss = ss // the rest of this request sees it
	}
	return ss, nil
}

// put stores ss: a new session (counted against maxSessions, its ttl
// starting now), or a replacement of one stored. A stored session that
// ended meanwhile stays ended, and put says so.
func (s *sessions) put(ctx context.Context, ss *session) error {
	if !ss.stored {
		n, err := s.store.Count(ctx)
		if err != nil {
			return err
		}
		if n >= maxSessions {
			return errTooManySessions
		}
		now := s.now()
		ss.created, ss.refreshed = now, now
	}
	b, err := ss.seal()
	if err != nil {
		return err
	}
	if !ss.stored {
		if err := s.store.Create(ctx, ss.name, b, s.idle); err != nil {
			return err
		}
		ss.stored = true
		return nil
	}
	ok, err := s.store.Put(ctx, ss.name, b)
	if err == nil && !ok {
		err = errors.New("console: the session ended")
	}
	return err
}

// end ends ss on every replica and clears its cookie. The cookie goes
// even when the store does not answer (the error says so): this browser
// is signed out at once, and the stored session ends at its idle timeout.
func (s *sessions) end(w http.ResponseWriter, r *http.Request, ss *session) error {
	var err error
	if ss != nil && ss.stored {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), storeTimeout)
		defer cancel()
		if err = s.store.Delete(ctx, ss.name); err != nil {
			s.log.Warn("console: ending a session failed; it ends at its idle timeout", "err", err)
		}
		ss.stored = false
	}
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: "", Path: Path, MaxAge: -1,
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode,
	})
	return err
}

// update changes ss with change and stores it, at best: what it keeps (a
// message, a name) is a convenience, never what a decision depends on.
func (s *sessions) update(ss *session, change func(*session)) {
	if ss == nil || ss.secret == nil {
		return
	}
	change(ss)
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := s.put(ctx, ss); err != nil {
		s.log.Warn("console: storing the session failed", "err", err)
	}
}

// setFlash and takeFlash pass a message to the page after a redirect,
// through the store: the redirect may land on another replica.
func (s *sessions) setFlash(ss *session, msg string) {
	s.update(ss, func(ss *session) { ss.flash = msg })
}

func (s *sessions) takeFlash(ss *session) string {
	if ss == nil || ss.flash == "" {
		return ""
	}
	m := ss.flash
	s.update(ss, func(ss *session) { ss.flash = "" })
	return m
}

// setActor remembers the name a reviewer gave without authentication, if
// the API could record it (at most 128 bytes).
func (s *sessions) setActor(ss *session, actor string) {
	if ss == nil || ss.actor == actor || len(actor) > 128 {
		return
	}
	s.update(ss, func(ss *session) { ss.actor = actor })
}

// signinFailures limits wrong tokens per client address: signInBurst at
// once, then one per signInEvery, so that guessing tokens through the form
// is slow (the tokens themselves are long and random; this is against
// their leaking in part). The most recent maxSessions addresses are kept.
// Per replica: a guesser spread over n replicas gets n times the rate.
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

// startSignedIn starts the signed-in session of token and sets its cookie,
// or renders why it could not: too many sessions, or a store that does
// not answer. It reports whether the session started.
func (c *Console) startSignedIn(w http.ResponseWriter, r *http.Request, token string) bool {
	_, err := c.sessions.start(w, r, token)
	switch {
	case err == nil:
		return true
	case errors.Is(err, errTooManySessions):
		c.cfg.Log.Warn("console: sign-in refused: too many sessions", "limit", maxSessions, "peer", r.RemoteAddr)
		c.problem(w, r, nil, http.StatusServiceUnavailable, "Too many sessions",
			fmt.Sprintf("The console holds as many signed-in sessions as it may (%d, counted over every replica of intentd), so you were not signed in. Try again in a few minutes, when idle sessions have ended, or ask whoever runs intentd.", maxSessions))
	default:
		c.cfg.Log.Warn("console: sign-in failed: storing the session", "err", err, "peer", r.RemoteAddr)
		c.problem(w, r, nil, http.StatusServiceUnavailable, "intentd cannot reach its store",
			"You were not signed in: the console could not store your session. Try again in a moment.")
	}
	return false
}

// endSession signs ss out on every replica and clears its cookie, or, when
// the store does not answer, says that only this browser was signed out.
// It reports whether the session ended everywhere.
func (c *Console) endSession(w http.ResponseWriter, r *http.Request, ss *session) bool {
	if err := c.sessions.end(w, r, ss); err != nil {
		c.problem(w, r, nil, http.StatusServiceUnavailable, "Signed out of this browser only",
			fmt.Sprintf("This browser no longer holds your session, but intentd could not reach its store to end it on every replica: it ends by itself after %v without use. Sign in and out again once intentd answers to end it now.", c.cfg.IdleTimeout))
		return false
	}
	return true
}
