package etcdstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
)

// The revision floor's file: the floor kept across restarts (see Floor).

// FloorFileName is the file, in the directory given to HoldFloor (intentd's
// data directory), that remembers per installation the highest etcd
// revision this replica saw. Fencing tokens are derived from etcd
// revisions; the file is how a restarted replica notices that etcd's
// revision went back (a snapshot restore without a revision bump) before
// it hands out a token that was already handed out.
//
// The file is a JSON object mapping installation id (the value of the key
// <prefix>installation in etcd) to a revision:
//
//	{"X4JQ7C2KQ6ZQ3PUBVZ5HKT5MZI": 18342}
const FloorFileName = "revision-floor.json"

// floorPath is where the floor file of a data directory lives.
func floorPath(dataDir string) string { return filepath.Join(dataDir, FloorFileName) }

// readFloors reads a floor file. A missing file holds no floors; a file
// that does not parse is an error, never an empty floor: starting without
// the floor is what the file exists to prevent.
func readFloors(path string) (map[string]int64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]int64{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("revision floor %s: %w", path, err)
	}
	floors := map[string]int64{}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&floors); err != nil {
		return nil, fmt.Errorf("revision floor %s: %w (fix it, or delete it only if no token handed out before is still held by a worker or a gateway)", path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("revision floor %s: data after the JSON object", path)
	}
	return floors, nil
}

// writeFloor records that installation reached rev. It merges with what the
// file holds, keeping the higher revision of each installation, because
// two intentd processes may share a data directory (external etcd with the
// default --data-dir). The read-merge-write is not locked across
// processes: a race may keep the other process's slightly lower revision,
// which is still one etcd really reached and is raised again at that
// process's next write. The file is replaced atomically: a temporary file
// in the same directory, fsync, rename, fsync of the directory, so that a
// crash leaves the old file or the new one, never a torn one.
func writeFloor(path, installation string, rev int64) error {
	floors, err := readFloors(path)
	if err != nil {
		return err
	}
	if floors[installation] >= rev {
		return nil
	}
	floors = maps.Clone(floors)
	floors[installation] = rev
	b, err := json.Marshal(floors)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+FloorFileName+".*")
	if err != nil {
		return fmt.Errorf("revision floor: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("revision floor: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("revision floor: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("revision floor: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("revision floor: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("revision floor: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("revision floor: sync %s: %w", dir, err)
	}
	return nil
}
