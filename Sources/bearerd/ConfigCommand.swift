import ArgumentParser
import BearerdConfig

/// `bearerd config schema` and `bearerd config reference`: the JSON Schema and the Markdown
/// reference of bearerd.yaml, generated from `ConfigReference` (stateless, prints to stdout).
struct ConfigCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "config",
        abstract: "Describe the configuration file: its JSON Schema or its Markdown reference.",
        subcommands: [Schema.self, Reference.self]
    )

    struct Schema: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print the JSON Schema (draft 2020-12) of bearerd.yaml (docs/configuration.schema.json).")
        func run() { print(ConfigReference.jsonSchema(), terminator: "") }
    }

    struct Reference: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print the Markdown reference of every configuration key (docs/configuration.md).")
        func run() { print(ConfigReference.markdown(), terminator: "") }
    }
}
