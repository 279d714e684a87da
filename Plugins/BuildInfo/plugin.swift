import Foundation
import PackagePlugin

/// Writes `BuildInfo.swift` (the commit this build is of, as `buildCommit`) before every build of the
/// target that uses it.
///
/// The commit is the first 12 digits of `git rev-parse HEAD` in a clone, with `-modified` after it when
/// tracked files differ from it; in a tarball made by `git archive`, the `$Format:%H$` that
/// `.gitattributes` (export-subst) expands in `Sources/switchboard/commit.txt`; and `unknown` anywhere
/// else (a copy without `.git`, no `git`). The script rewrites the file only when the text changed, so
/// a build that changed nothing recompiles nothing; it never fails the build.
@main
struct BuildInfo: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: Target) throws -> [Command] {
        let output = context.pluginWorkDirectoryURL.appending(path: "generated")
        let script = #"""
            root=$1 archived=$2 out=$3
            commit=$(git -C "$root" rev-parse HEAD 2>/dev/null | cut -c1-12)
            if [ -n "$commit" ]; then
                changes=$(git -C "$root" --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null)
                [ -z "$changes" ] || commit="$commit-modified"
            else
                commit=$(cut -c1-12 "$archived" 2>/dev/null)
                case "$commit" in *[!0-9a-f]*|'') commit=unknown ;; esac
            fi
            mkdir -p "$out"
            text="/// The commit this build is of (written by the BuildInfo plugin).
            let buildCommit = \"$commit\""
            [ "$(cat "$out/BuildInfo.swift" 2>/dev/null)" = "$text" ] || printf '%s\n' "$text" > "$out/BuildInfo.swift"
            """#
        return [.prebuildCommand(
            displayName: "Recording the commit of \(target.name)", executable: URL(filePath: "/bin/sh"),
            arguments: ["-c", script, "sh", context.package.directoryURL.path,
                        target.directoryURL.appending(path: "commit.txt").path, output.path],
            outputFilesDirectory: output)]
    }
}
