package deploy

import (
	"net/url"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
)

// Compose runs PostgreSQL for the archive: a pinned image on an internal
// network only it and intentd join, with a volume and a health check of
// its own; every replica gets the same DSN, whose password comes from a
// mounted passfile (never the compose file or the environment), and waits
// for PostgreSQL to be healthy.
func TestComposeArchive(t *testing.T) {
	p := project(t)
	db, err := p.GetService("archive-db")
	if err != nil {
		t.Fatalf("no archive-db service: %v", err)
	}
	image, tag, _ := strings.Cut(db.Image, ":")
	if image != "postgres" || tag == "" || tag == "latest" || !strings.Contains(tag, ".") {
		t.Errorf("archive-db image %q, want postgres pinned to a minor version", db.Image)
	}
	checkCommon(t, p, db, "/var/lib/postgresql/data")
	if len(db.Networks) != 1 {
		t.Fatalf("archive-db networks %v, want exactly one", db.Networks)
	}
	var network string
	for n := range db.Networks {
		network = n
	}
	if !p.Networks[network].Internal {
		t.Errorf("network %q of archive-db is not internal", network)
	}
	if len(db.Ports) > 0 {
		t.Errorf("archive-db publishes ports %v: PostgreSQL must be reachable by intentd only", db.Ports)
	}
	for _, s := range p.Services {
		if _, on := s.Networks[network]; on && s.Name != "archive-db" && s.Name != "intentd-0" && s.Name != "intentd-1" {
			t.Errorf("service %s joins the archive network %q", s.Name, network)
		}
	}
	if pw := db.Environment["POSTGRES_PASSWORD"]; pw != nil {
		t.Errorf("archive-db: POSTGRES_PASSWORD in the compose file; want POSTGRES_PASSWORD_FILE from a secret")
	}

	var dsns []string
	for _, name := range []string{"intentd-0", "intentd-1"} {
		s, _ := p.GetService(name)
		if _, on := s.Networks[network]; !on {
			t.Errorf("%s does not join the archive network %q", name, network)
		}
		if d, ok := s.DependsOn["archive-db"]; !ok || d.Condition != types.ServiceConditionHealthy {
			t.Errorf("%s: depends_on archive-db is %+v, want condition service_healthy", name, d)
		}
		v := s.Environment["INTENTD_ARCHIVE_DSN"]
		if v == nil {
			t.Errorf("%s: no INTENTD_ARCHIVE_DSN", name)
			continue
		}
		dsns = append(dsns, *v)
		u, err := url.Parse(*v)
		if err != nil {
			t.Errorf("%s: INTENTD_ARCHIVE_DSN %q: %v", name, *v, err)
			continue
		}
		if _, has := u.User.Password(); has {
			t.Errorf("%s: INTENTD_ARCHIVE_DSN holds a password; want a passfile", name)
		}
		if u.Hostname() != "archive-db" {
			t.Errorf("%s: INTENTD_ARCHIVE_DSN host %q, want archive-db", name, u.Hostname())
		}
		passfile := u.Query().Get("passfile")
		mounted := false
		for _, sec := range s.Secrets {
			if "/run/secrets/"+sec.Source == passfile {
				mounted = true
			}
		}
		if !mounted {
			t.Errorf("%s: passfile %q is not a mounted secret", name, passfile)
		}
	}
	if len(dsns) == 2 && dsns[0] != dsns[1] {
		t.Errorf("the replicas have different archives: %q and %q", dsns[0], dsns[1])
	}
}

// On Kubernetes the DSN comes from the Secret intentd-archive, optional
// (without it intentd keeps everything in etcd), never from the args.
func TestKubernetesArchiveDSNFromASecret(t *testing.T) {
	_, c := intentdContainer(t, render(t, overlay))
	if _, ok := flagValue(c.Args, "archive-dsn"); ok {
		t.Error("--archive-dsn in the args: anyone who reads the Deployment reads the password")
	}
	for _, e := range c.Env {
		if e.Name != "INTENTD_ARCHIVE_DSN" {
			continue
		}
		ref := e.ValueFrom
		if e.Value != "" || ref == nil || ref.SecretKeyRef == nil {
			t.Fatalf("INTENTD_ARCHIVE_DSN %+v, want it from a Secret", e)
		}
		if ref.SecretKeyRef.Name != "intentd-archive" || ref.SecretKeyRef.Key != "dsn" || ref.SecretKeyRef.Optional == nil || !*ref.SecretKeyRef.Optional {
			t.Errorf("INTENTD_ARCHIVE_DSN from %+v, want the optional key dsn of Secret intentd-archive", ref.SecretKeyRef)
		}
		return
	}
	t.Error("no INTENTD_ARCHIVE_DSN in the intentd container")
}
