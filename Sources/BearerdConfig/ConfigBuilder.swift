import BearerdOAuth
import BearerdHTTP
import Foundation
import Yams
import BearerdProxyCore

/// One pass over one configuration text: composes the YAML node tree, walks it section by
/// section and collects every error on the way.
///
/// Owns the error list and the table of renamed duplicate keys; used once, on the caller's
/// thread. Invariant: `build` returns a config only if `errors` is empty (callers check both).
///
/// Duplicate keys: Yams refuses a mapping with a repeated key and stops at the first one. To
/// report the repeated key with its full path and still check the rest of the file, the builder
/// renames the later occurrence in the text (appending `duplicateMarker` and an index, which
/// keeps every line number) and composes again; the walk then reports the renamed key.
final class ConfigBuilder {
    static let syntaxKey = "yaml"
    static let documentKey = "(document)"
    /// A private-use character that cannot occur in a key the loader accepts.
    static let duplicateMarker: Character = "\u{E000}"

    let file: String
    let environment: [String: String]
    let checkFiles: Bool
    var errors: [ConfigError] = []
    /// `sessions.NAME` → line of its `subject_session:` value (chain errors are located there).
    var subjectSessionLines: [String: Int] = [:]
    /// Renamed duplicates by index: the key as written and the line of its first occurrence.
    private var duplicates: [(name: String, firstLine: Int)] = []

    init(file: String, environment: [String: String], checkFiles: Bool) {
        self.file = file
        self.environment = environment
        self.checkFiles = checkFiles
    }

    func fail(_ line: Int, _ key: String, _ message: String) {
        errors.append(ConfigError(file: file, line: line, key: key, message: message))
    }

    // MARK: - YAML

    /// The root node; `.none` after a syntax error (recorded), `.some(nil)` for an empty document.
    func compose(_ yaml: String) -> Node?? {
        var text = yaml
        for _ in 0..<200 {
            do {
                return .some(try Yams.compose(yaml: text))
            } catch let YamlError.duplicatedKeysInMapping(names, context) {
                guard let name = names.first, let renamed = renameDuplicate(name, after: context.mark, in: text) else {
                    fail(context.mark.line, names.first ?? Self.syntaxKey, "duplicate key in a mapping")
                    return .none
                }
                text = renamed
            } catch let error as YamlError {
                reportSyntax(error, text: text)
                return .none
            } catch {
                fail(1, Self.syntaxKey, "cannot parse: \(error)")
                return .none
            }
        }
        fail(1, Self.syntaxKey, "too many duplicate keys")
        return .none
    }

    private func reportSyntax(_ error: YamlError, text: String) {
        switch error {
        case .scanner(let context, let problem, let mark, _), .parser(let context, let problem, let mark, _),
             .composer(let context, let problem, let mark, _):
            var message = problem
            if problem == "but found another document" {
                fail(mark.line, Self.syntaxKey, "a second YAML document starts here; bearerd reads one document per file")
                return
            }
            if let context {
                message += " \(context.text)"
                if context.mark.line != mark.line, context.mark.line > 0 { message += " (which starts at line \(context.mark.line))" }
            }
            let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
            let line = mark.line >= 1 && mark.line <= lines.count ? lines[mark.line - 1] : ""
            if line.prefix(while: { $0 == " " || $0 == "\t" }).contains("\t") {
                message += "; YAML does not allow tabs for indentation"
            } else if line.contains("]:"), line.contains("[") {
                message += "; quote IPv6 addresses: \"[::1]:8080\""
            } else if message.contains("mapping values are not allowed") {
                message += "; a value containing ': ' must be quoted"
            }
            fail(mark.line, Self.syntaxKey, message)
        case .reader(let problem, let offset, _, let yaml):
            let line = offset.map { yaml.prefix($0).reduce(1) { $1 == "\n" ? $0 + 1 : $0 } } ?? 1
            fail(line, Self.syntaxKey, problem)
        default:
            fail(1, Self.syntaxKey, "cannot parse the file")
        }
    }

    /// The text with the next occurrence of key `name` after its first occurrence (at `first`)
    /// renamed to `name` + marker + index; `nil` if it cannot be found.
    private func renameDuplicate(_ name: String, after first: Mark, in text: String) -> String? {
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map { Array(String($0).unicodeScalars) }
        let firstLine = first.line - 1, firstColumn = first.column - 1
        guard firstLine >= 0, firstLine < lines.count, firstColumn >= 0, firstColumn <= lines[firstLine].count else { return nil }
        let forms = [name, "\"\(name)\"", "'\(name)'"].map { Array($0.unicodeScalars) }

        /// Length of the key form at `column` of `line` if it is followed by optional blanks and `:`.
        func keyForm(at line: Int, _ column: Int) -> [Unicode.Scalar]? {
            let s = lines[line]
            for form in forms where column + form.count <= s.count && Array(s[column..<column + form.count]) == form {
                var i = column + form.count
                while i < s.count, s[i] == " " || s[i] == "\t" { i += 1 }
                if i < s.count, s[i] == ":" { return form }
            }
            return nil
        }
        // Flow mapping (`{a: 1, a: 2}`) if the first key follows `{` or `,`; else block style.
        let before = lines[firstLine][..<firstColumn].reversed().first { $0 != " " && $0 != "\t" }
        var found: (line: Int, column: Int, form: [Unicode.Scalar])?
        if before == "{" || before == "," {
            var line = firstLine, column = firstColumn + 1
            search: while line < lines.count {
                let s = lines[line]
                while column < s.count {
                    if let form = keyForm(at: line, column) {
                        let previous = s[..<column].reversed().first { $0 != " " && $0 != "\t" }
                        if previous == "{" || previous == "," || (previous == nil && line > firstLine) {
                            found = (line, column, form)
                            break search
                        }
                    }
                    column += 1
                }
                line += 1
                column = 0
            }
        } else {
            for line in (firstLine + 1)..<max(firstLine + 1, lines.count) where firstColumn < lines[line].count {
                guard lines[line][..<firstColumn].allSatisfy({ $0 == " " }) else { continue }
                if let form = keyForm(at: line, firstColumn) {
                    found = (line, firstColumn, form)
                    break
                }
            }
        }
        guard let found else { return nil }
        let quoted = found.form.count != name.unicodeScalars.count
        let insertAt = found.column + (quoted ? 1 : 0) + name.unicodeScalars.count
        let marker = Array("\(Self.duplicateMarker)\(duplicates.count)".unicodeScalars)
        lines[found.line].insert(contentsOf: marker, at: insertAt)
        duplicates.append((name, first.line))
        return lines.map { line in
            var s = String.UnicodeScalarView()
            s.append(contentsOf: line)
            return String(s)
        }.joined(separator: "\n")
    }

    // MARK: - Mappings

    /// One key of a mapping as written, with the line of the key and the value node.
    struct Entry {
        var name: String
        var keyLine: Int
        var value: Node
        var valueLine: Int { value.mark?.line ?? keyLine }
    }

    /// The checked keys of one mapping: unknown and duplicate keys already reported and dropped.
    struct Fields {
        /// Dotted path of the mapping (`""` at top level).
        var path: String
        /// Line of the key owning this mapping, where missing keys are reported.
        var line: Int
        var known: [String]?
        var entries: [Entry] = []

        subscript(name: String) -> Entry? {
            assert(known?.contains(name) ?? true, "key \(name) missing from the ConfigKeys table of \(path)")
            return entries.first { $0.name == name }
        }

        func key(_ name: String) -> String { ConfigBuilder.child(path, name) }
    }

    static func child(_ path: String, _ name: String) -> String {
        path.isEmpty ? name : "\(path).\(name)"
    }

    static func label(_ path: String) -> String { path.isEmpty ? documentKey : path }

    static func line(_ node: Node) -> Int { node.mark?.line ?? 0 }

    static func isNull(_ node: Node) -> Bool {
        guard case .scalar(let s) = node, s.style == .plain || s.style == .any else { return false }
        return ["", "~", "null", "Null", "NULL"].contains(s.string)
    }

    /// `a mapping`, `a list`, `an empty value`, or the quoted scalar (`a value` when secret).
    static func describe(_ node: Node, secret: Bool = false) -> String {
        switch node {
        case .mapping: return "a mapping"
        case .sequence: return "a list"
        case .alias: return "an alias"
        case .scalar(let s):
            if isNull(node) { return "an empty value" }
            return secret ? "a value" : ConfigValues.quoted(s.string)
        }
    }

    /// Checks `node` is a mapping and reads its keys: `known` (nil: any key, e.g. session names)
    /// limits them, `<<` merge keys are expanded (explicit keys win), duplicates and unknown keys
    /// are reported. `nil` (error recorded) if `node` is not a mapping.
    func fields(_ node: Node, path: String, line: Int, known: [String]?, expected: String) -> Fields? {
        guard case .mapping(let mapping) = node else {
            fail(Self.line(node) == 0 ? line : Self.line(node), Self.label(path), "expected \(expected), got \(Self.describe(node))")
            return nil
        }
        var result = Fields(path: path, line: line, known: known)
        var merged: [Entry] = []
        for (keyNode, value) in mapping {
            guard case .scalar(let keyScalar) = keyNode else {
                fail(Self.line(keyNode), Self.label(path), "keys must be plain text, got \(Self.describe(keyNode)) as a key")
                continue
            }
            let keyLine = keyScalar.mark?.line ?? line
            if keyScalar.string == "<<", keyScalar.style == .plain {
                collectMerge(value, path: path, into: &merged)
                continue
            }
            var name = keyScalar.string
            if let marker = name.firstIndex(of: Self.duplicateMarker) {
                let index = Int(name[name.index(after: marker)...]) ?? 0
                name = String(name[..<marker])
                let firstLine = index < duplicates.count ? duplicates[index].firstLine : 0
                fail(keyLine, Self.child(path, name), "duplicate key (already set at line \(firstLine))")
                continue
            }
            guard checkKnown(name, line: keyLine, fields: result) else { continue }
            result.entries.append(Entry(name: name, keyLine: keyLine, value: value))
        }
        for entry in merged where !result.entries.contains(where: { $0.name == entry.name }) {
            guard checkKnown(entry.name, line: entry.keyLine, fields: result) else { continue }
            result.entries.append(entry)
        }
        return result
    }

    /// `<<: *base` or `<<: [*a, *b]` (YAML merge keys): earlier mappings win over later ones.
    private func collectMerge(_ value: Node, path: String, into merged: inout [Entry]) {
        switch value {
        case .mapping(let mapping):
            for (keyNode, v) in mapping {
                guard case .scalar(let k) = keyNode, !merged.contains(where: { $0.name == k.string }) else { continue }
                if k.string == "<<" { collectMerge(v, path: path, into: &merged); continue }
                merged.append(Entry(name: k.string, keyLine: k.mark?.line ?? 0, value: v))
            }
        case .sequence(let sequence):
            for item in sequence { collectMerge(item, path: path, into: &merged) }
        default:
            fail(Self.line(value), Self.child(path, "<<"), "a merge key takes a mapping or a list of mappings, got \(Self.describe(value))")
        }
    }

    private func checkKnown(_ name: String, line: Int, fields: Fields) -> Bool {
        guard let known = fields.known, !known.contains(name) else { return true }
        var message = "unknown key"
        if let guess = ConfigValues.suggestion(for: name, among: known) {
            message += " (did you mean \(guess)?)"
        } else if known == ConfigKeys.route, ConfigKeys.session.contains(name) {
            message += " ('\(name)' belongs in a session under sessions:, which the route names with session:)"
        } else if known == ConfigKeys.session, ConfigKeys.route.contains(name) {
            message += " ('\(name)' belongs in a route under routes:)"
        } else {
            message += " (expected one of: \(known.joined(separator: ", ")))"
        }
        fail(line, fields.key(name), message)
        return false
    }

    func missing(_ fields: Fields, _ name: String, _ hint: String = "") {
        fail(fields.line, fields.key(name), "missing required key" + (hint.isEmpty ? "" : " (\(hint))"))
    }

    // MARK: - Scalars

    /// The text of a scalar value; reports lists, mappings and empty values. `secret` keeps the
    /// value out of messages.
    func text(_ entry: Entry, in fields: Fields, expected: String = "a string", secret: Bool = false) -> String? {
        let key = fields.key(entry.name)
        guard case .scalar(let scalar) = entry.value, !Self.isNull(entry.value) else {
            fail(entry.valueLine, key, "expected \(expected), got \(Self.describe(entry.value, secret: secret))")
            return nil
        }
        guard !scalar.string.isEmpty else {
            fail(entry.valueLine, key, "must not be empty")
            return nil
        }
        return scalar.string
    }

    func text(_ fields: Fields, _ name: String, expected: String = "a string") -> String? {
        fields[name].flatMap { text($0, in: fields, expected: expected) }
    }

    /// Runs a value parser on a scalar, reporting its problem at the value's line.
    func parsed<T>(_ fields: Fields, _ name: String, expected: String,
                   _ parse: (String) throws(ConfigValues.Problem) -> T) -> T? {
        guard let entry = fields[name], let raw = text(entry, in: fields, expected: expected) else { return nil }
        do throws(ConfigValues.Problem) {
            return try parse(raw)
        } catch {
            fail(entry.valueLine, fields.key(name), error.message)
            return nil
        }
    }

    /// The items of a key that takes one value or a list of them (`[401, 403]` or `401`);
    /// anything else is reported as "expected `expected`" and gives nil.
    func listItems(_ entry: Entry, key: String, expected: String) -> [Node]? {
        switch entry.value {
        case .sequence(let sequence): return Array(sequence)
        case .scalar where !Self.isNull(entry.value): return [entry.value]
        default:
            fail(entry.valueLine, key, "expected \(expected), got \(Self.describe(entry.value))")
            return nil
        }
    }

    /// A duration, refused above `maximum` (`FILE:LINE: key: must be at most 24h, got "…"`).
    func duration(_ fields: Fields, _ name: String, maximum: Duration = ConfigValues.maximumTimeout) -> Duration? {
        parsed(fields, name, expected: "a duration such as 500ms, 30s, 5m or 1h") { (raw: String) throws(ConfigValues.Problem) -> Duration in
            try ConfigValues.duration(raw, maximum: maximum)
        }
    }

    /// A size in `minimum...maximum` bytes.
    func size(_ fields: Fields, _ name: String, minimum: Int, maximum: Int = ConfigValues.maximumSize) -> Int? {
        guard let value = parsed(fields, name, expected: "a size such as 65536, 64KiB or 1MiB", { (raw: String) throws(ConfigValues.Problem) -> Int in
            try ConfigValues.size(raw, maximum: maximum)
        }) else { return nil }
        guard value >= minimum else {
            fail(fields[name]?.valueLine ?? fields.line, fields.key(name), "must be at least \(minimum) bytes, got \(value)")
            return nil
        }
        return value
    }

    func integer(_ fields: Fields, _ name: String, range: ClosedRange<Int>) -> Int? {
        parsed(fields, name, expected: "a whole number") { (raw: String) throws(ConfigValues.Problem) -> Int in
            guard let n = Int(raw) else { throw ConfigValues.Problem("expected a whole number, got \(ConfigValues.quoted(raw))") }
            guard range.contains(n) else {
                throw ConfigValues.Problem("must be \(range.upperBound == Int.max ? "at least \(range.lowerBound)" : "\(range.lowerBound)–\(range.upperBound)"), got \(n)")
            }
            return n
        }
    }

    func bool(_ fields: Fields, _ name: String) -> Bool? {
        parsed(fields, name, expected: "true or false") { (raw: String) throws(ConfigValues.Problem) -> Bool in
            switch raw {
            case "true", "True", "TRUE": return true
            case "false", "False", "FALSE": return false
            default: throw ConfigValues.Problem("expected true or false, got \(ConfigValues.quoted(raw))")
            }
        }
    }

    func choice<T: RawRepresentable & CaseIterable>(_ fields: Fields, _ name: String, _ type: T.Type) -> T? where T.RawValue == String {
        let names = T.allCases.map(\.rawValue)
        let expected = "one of " + names.joined(separator: ", ")
        return parsed(fields, name, expected: expected) { (raw: String) throws(ConfigValues.Problem) -> T in
            if let value = T(rawValue: raw) { return value }
            var message = "expected \(expected), got \(ConfigValues.quoted(raw))"
            if let guess = ConfigValues.suggestion(for: raw.replacingOccurrences(of: "-", with: "_"), among: names) {
                message += " (did you mean \(guess)?)"
            }
            throw ConfigValues.Problem(message)
        }
    }

    /// A file path, made absolute relative to the configuration file's directory; with
    /// `checkFiles`, `mustRead` requires it to be readable.
    /// `*_file` keys and the `tls` files also take `credential:NAME` (see `filePath`).
    func path(_ fields: Fields, _ name: String, mustRead: Bool) -> String? {
        guard let entry = fields[name], var raw = text(entry, in: fields, expected: "a file path") else { return nil }
        // `~/…`: the user's home directory ($HOME), as a shell would read it (configs for people).
        if raw.hasPrefix("~/") {
            guard let home = environment["HOME"], home.hasPrefix("/") else {
                fail(entry.valueLine, fields.key(name), "\(raw) starts with ~/ but HOME is not set to an absolute path")
                return nil
            }
            raw = (home.hasSuffix("/") ? String(home.dropLast()) : home) + String(raw.dropFirst())
        }
        let takesCredential = name.hasSuffix("_file") || name == "client_cert" || name == "client_key"
        guard let resolved = takesCredential ? filePath(raw, line: entry.valueLine, key: fields.key(name))
                                             : ConfigFiles.resolve(raw, relativeTo: file) else { return nil }
        if checkFiles, mustRead {
            do throws(ConfigFiles.Failure) {
                try ConfigFiles.checkReadable(resolved)
            } catch {
                fail(entry.valueLine, fields.key(name), "cannot read \(resolved): \(error.reason)")
            }
        }
        return resolved
    }

    static let credentialPrefix = "credential:"

    /// The path a `*_file` value names: `credential:NAME` is `$CREDENTIALS_DIRECTORY/NAME`
    /// (systemd's `LoadCredential=`/`SetCredential=`, systemd.exec(5) "Credentials"); anything
    /// else is a path, relative to the configuration file's directory. nil (error recorded) when
    /// CREDENTIALS_DIRECTORY is unset or NAME is empty, `.`, `..` or holds a `/`.
    func filePath(_ raw: String, line: Int, key: String) -> String? {
        guard raw.hasPrefix(Self.credentialPrefix) else { return ConfigFiles.resolve(raw, relativeTo: file) }
        let name = String(raw.dropFirst(Self.credentialPrefix.count))
        guard !name.isEmpty, name != ".", name != "..", !name.contains("/"), !name.contains("\0") else {
            fail(line, key, "expected credential:NAME with a credential name (no '/', not '.' or '..'), got \(ConfigValues.quoted(raw))")
            return nil
        }
        guard let dir = environment["CREDENTIALS_DIRECTORY"], !dir.isEmpty else {
            fail(line, key, "\(raw) needs $CREDENTIALS_DIRECTORY, which is not set: systemd sets it for a unit with LoadCredential=\(name):PATH; "
                 + "outside systemd, set CREDENTIALS_DIRECTORY to the directory holding the file \(name)")
            return nil
        }
        return (dir.hasSuffix("/") ? String(dir.dropLast()) : dir) + "/" + name
    }

    func address(_ node: Node, key: String) -> ListenAddress? {
        let hint = "expected an address such as 127.0.0.1:8080, \"[::1]:8080\" or unix:/run/bearerd.sock"
        guard case .scalar(let scalar) = node, !Self.isNull(node) else {
            let quoteHint = Self.isNull(node) ? "" : " (quote IPv6 addresses: \"[::1]:8080\")"
            fail(Self.line(node), key, "\(hint), got \(Self.describe(node))\(quoteHint)")
            return nil
        }
        do throws(ConfigValues.Problem) {
            return try ConfigValues.address(scalar.string)
        } catch {
            fail(Self.line(node), key, error.message)
            return nil
        }
    }
}
