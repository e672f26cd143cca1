// TEMPORARY until the config branch is merged.
import Foundation
public enum ConfigLoader {
    public static func load(path: String, environment: [String: String] = ProcessInfo.processInfo.environment, checkFiles: Bool = true) throws(ConfigErrors) -> BearerdConfig {
        throw ConfigErrors([])
    }
    public static func parse(yaml: String, file: String, environment: [String: String], checkFiles: Bool = true) throws(ConfigErrors) -> BearerdConfig {
        throw ConfigErrors([])
    }
}
