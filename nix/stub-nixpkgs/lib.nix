# The few nixpkgs `lib` functions the flake uses, with nixpkgs' names and behaviour.
let
  lower = "abcdefghijklmnopqrstuvwxyz";
  upper = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  chars = s: builtins.genList (i: builtins.substring i 1 s) (builtins.stringLength s);
  lib = {
    genAttrs =
      names: f:
      builtins.listToAttrs (
        map (name: {
          inherit name;
          value = f name;
        }) names
      );
    any = builtins.any;
    hasPrefix = prefix: s: builtins.substring 0 (builtins.stringLength prefix) s == prefix;
    toLower = builtins.replaceStrings (chars upper) (chars lower);
    optionalString = cond: s: if cond then s else "";
    getName = x: x.pname or (builtins.parseDrvName x.name).name;
    # Stricter than nixpkgs (which warns and guesses): a program must say its main program.
    getExe =
      x:
      "${x}/bin/${
        x.meta.mainProgram or (throw "lib.getExe: ${x.name} has no meta.mainProgram")
      }";
    getExe' = x: name: "${x}/bin/${name}";
    platforms.linux = [
      "x86_64-linux"
      "aarch64-linux"
    ];
    licenses.asl20 = {
      spdxId = "Apache-2.0";
      free = true;
    };

    fileset = {
      # A fileset is the list of paths it unions; like nixpkgs, a missing path is an error.
      unions =
        paths:
        map (
          p:
          if builtins.pathExists p then
            p
          else
            throw "lib.fileset.unions: ${toString p} does not exist"
        ) paths;
      # Copies only the union (and the folders leading to it), as nixpkgs does.
      toSource =
        { root, fileset }:
        let
          wanted = map toString fileset;
          keep =
            path: _type:
            builtins.any (
              w: w == path || lib.hasPrefix (w + "/") path || lib.hasPrefix (path + "/") w
            ) wanted;
        in
        builtins.path {
          path = root;
          name = "source";
          filter = keep;
        };
    };
  };
in
lib
