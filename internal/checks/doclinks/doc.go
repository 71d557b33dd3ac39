// Package doclinks holds a test, and nothing else: every relative link in
// the repository's Markdown files must resolve inside the repository — to a
// file or directory that a clone has, and to a heading that exists when the
// link names one. A link out of the repository (../something) would work on
// one machine and be dead in every clone.
package doclinks
